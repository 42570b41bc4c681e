-- ARGV[3] worker, ARGV[4] session ('' = any), ARGV[5] reason, ARGV[6] task ('' = all of them).
-- The worker's connection broke, it came back as a new process, or a restarted coordinator reclaims its
-- own reducer leases: those leases go back to the front at once, no attempt spent. When the worker's
-- current session is the one that broke, the worker is marked lost. Returns the returned task ids.
local worker, session, reason, only = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local lost = {}
for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
  local t = redis.call('HMGET', key('task', tid), 'worker', 'session')
  local mine = t[1] == worker and (session == '' or t[2] == session)
  if mine and (only == '' or only == tid) and lose_task(tid, 'task_lost', reason) then
    lost[#lost + 1] = tid
  end
end
local wk = key('worker', worker)
local w = redis.call('HMGET', wk, 'session', 'state')
if session ~= '' and w[1] == session and w[2] ~= 'drained' then
  redis.call('HSET', wk, 'state', 'lost', 'current_task', '')
  feed({type = 'worker_lost', worker = worker, reason = reason, leases = #lost})
end
return lost
