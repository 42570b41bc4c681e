-- ARGV[3] render id. Run a failed or cancelled render again under its own id, keeping every task that
-- finished: the others start over (no attempts spent, a new fence so a straggler's result is stale) and
-- queue as their inputs are done; a render whose tasks all finished is assembled again.
-- Returns 'retried', 'live' (not ended), 'missing', 'gone' when a blob the kept tasks made or a task
-- reads is no longer stored (then nothing changed: the caller renders it anew), or 'fails_again' when it
-- failed on an error every worker would hit (common.lua task_failed): only another spec can help.
local rid = ARGV[3]
local rk = key('render', rid)
local state = redis.call('HGET', rk, 'state')
if not state then return 'missing' end
if state ~= 'failed' and state ~= 'cancelled' then return 'live' end
if redis.call('HGET', rk, 'fails_again') == '1' then return 'fails_again' end
local tids = redis.call('LRANGE', key('render', rid, 'tasks'), 0, -1)
for _, tid in ipairs(tids) do  -- check first: a retry that cannot finish changes nothing
  local t = redis.call('HMGET', key('task', tid), 'state', 'outputs', 'input_refs')
  local ok, refs = pcall(cjson.decode, t[3] or '{}')
  for _, ref in pairs(ok and type(refs) == 'table' and refs or {}) do
    if type(ref) == 'table' and ref.blob and redis.call('EXISTS', key('blob', ref.blob)) == 0 then return 'gone' end
  end
  if t[1] == 'done' then
    for _, sha in pairs(cjson.decode(t[2] or '{}')) do
      if type(sha) == 'string' and redis.call('EXISTS', key('blob', sha)) == 0 then return 'gone' end
    end
  end
end
local remaining, again = 0, {}
for _, tid in ipairs(tids) do
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'state', 'worker', 'leased_ms', 'capability')
  if t[1] ~= 'done' then
    if t[1] == 'leased' then release(tid, t[2], t[3], nil, 'cancelled') end
    if t[1] == 'queued' then redis.call('ZREM', key('ready', t[4]), tid) end
    redis.call('HSET', tk, 'state', 'waiting', 'fence', redis.call('INCR', key('fence')), 'attempts', 0,
      'failures', 0, 'failed_on', '', 'fault_error', '', 'fault_worker', '', 'lost', 0, 'error', '', 'worker', '',
      'outputs', '{}', 'inputs', '{}', 'progress', '{}', 'leased_ms', 0, 'deadline_ms', 0, 'done_ms', 0, 'stuck_ms', 0)
    remaining = remaining + 1
    again[#again + 1] = tid
  end
end
redis.call('HSET', rk, 'state', remaining < #tids and 'running' or 'queued', 'error', '', 'finished_ms', 0,
  'remaining', remaining)
clear_blocklist(rid)
emit(rid, {type = 'render_retried', previous = state, tasks = remaining})
for _, tid in ipairs(again) do  -- pending: this task's deps not done; each dep lists it again
  local pending = 0
  local seq = tonumber(redis.call('HGET', key('task', tid), 'seq')) or 0
  for _, d in ipairs(cjson.decode(redis.call('HGET', key('task', tid), 'deps') or '[]')) do
    if redis.call('HGET', key('task', d), 'state') ~= 'done' then
      pending = pending + 1
      redis.call('ZADD', key('task', d, 'dependents'), seq, tid)
    end
  end
  redis.call('SET', key('task', tid, 'pending'), pending)
end
for _, tid in ipairs(again) do
  if redis.call('GET', key('task', tid, 'pending')) == '0' and render_active(rid) then make_ready(tid, rid) end
end
if remaining == 0 then redis.call('SADD', key('to_assemble'), rid) end
return 'retried'
