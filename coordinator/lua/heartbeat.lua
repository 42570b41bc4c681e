-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] lease ms, ARGV[7] progress JSON or ''.
local tid, worker = ARGV[3], ARGV[4]
local render = holder_render(tid, worker, ARGV[5])
if not render then return 'stale' end
if not render_active(render) then return 'cancel' end
local deadline = NOW + tonumber(ARGV[6])
redis.call('ZADD', key('leases'), deadline, tid)
redis.call('HSET', key('task', tid), 'deadline_ms', deadline)
redis.call('HSET', key('worker', worker), 'last_seen_ms', NOW)
if ARGV[7] ~= '' then
  redis.call('HSET', key('task', tid), 'progress', ARGV[7])
  emit(render, {type = 'task_progress', task = tid, worker = worker, progress = cjson.decode(ARGV[7])})
end
return 'ok'
