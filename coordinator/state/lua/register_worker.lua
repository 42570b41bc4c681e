-- ARGV[3] worker id, ARGV[4] info JSON, ARGV[5] '1' when a running agent registers again after losing
-- its coordinator, ARGV[6] the agent process's session id ('' when unknown). Counters survive a
-- re-registration; a drain mark survives only a resumed one. A new session means the worker's last
-- process is gone: the leases it still held go back at once, no attempt spent. ARGV[8]: why the
-- coordinator refuses this worker ('' = accepted): recorded (state 'refused', shown by `farm workers`)
-- and lease.lua gives it nothing until it registers again accepted.
local wk = key('worker', ARGV[3])
local session = ARGV[6] or ''
if session ~= '' then
  for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
    local t = redis.call('HMGET', key('task', tid), 'worker', 'session')
    if t[1] == ARGV[3] and t[2] ~= session then lose_task(tid, 'task_lost', ARGV[3] .. ' restarted') end
  end
end
if ARGV[7] == '1' then  -- ARGV[7] '1': the agent holds no task, so a lease of its is one it never got
  for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
    if redis.call('HGET', key('task', tid), 'worker') == ARGV[3] then
      lose_task(tid, 'task_lost', ARGV[3] .. ' never got its lease (the reply was lost)')
    end
  end
end
local refused = ARGV[8] or ''
redis.call('HSET', wk, 'info', ARGV[4], 'registered_ms', NOW, 'last_seen_ms', NOW,
  'state', refused == '' and 'idle' or 'refused', 'current_task', '', 'session', session, 'refused', refused)
if ARGV[5] ~= '1' then redis.call('HSET', wk, 'drain', 0) end
for _, f in ipairs({'tasks_done', 'failures', 'busy_ms'}) do redis.call('HSETNX', wk, f, 0) end
redis.call('SADD', key('workers'), ARGV[3])
return 1
