-- ARGV[3] task id. An operator takes a leased task away from its worker and queues it again (a new
-- fence at once, so the old holder's result is stale), and gives the workers blocklisted for its render
-- another chance. 1 when either happened, 0 otherwise.
local tid = ARGV[3]
local tk = key('task', tid)
local t = redis.call('HMGET', tk, 'state', 'worker', 'render', 'leased_ms')
if not t[3] or not render_active(t[3]) then return 0 end
local done = 0
if (redis.call('HGET', key('render', t[3]), 'blocklist') or '') ~= '' then
  clear_blocklist(t[3])
  done = 1
end
if t[1] ~= 'leased' then return done end
redis.call('HSET', tk, 'fence', redis.call('INCR', key('fence')))
release(tid, t[2], t[4], nil, 'requeued')  -- not the worker's failure
redis.call('HSET', tk, 'state', 'queued', 'error', 'requeued by an operator from ' .. t[2], 'queued_ms', NOW)
push_ready(tid, true)
emit(t[3], {type = 'task_requeued', task = tid, worker = t[2]})
return 1
