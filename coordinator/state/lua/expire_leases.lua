-- ARGV[3] now in ms, or '' for the Redis clock. Returns the ids of the leases that ran out.
-- A worker that stopped heartbeating (frozen, partitioned, asleep) loses its lease at the deadline;
-- the task goes back to the front without spending an attempt (the machine's fault, not the task's).
local now = NOW
if ARGV[3] ~= '' then now = tonumber(ARGV[3]) end
local expired = {}
for _, tid in ipairs(redis.call('ZRANGEBYSCORE', key('leases'), '-inf', now)) do
  local worker = redis.call('HGET', key('task', tid), 'worker') or '?'
  if lose_task(tid, 'task_expired', 'lease expired on ' .. worker) then expired[#expired + 1] = tid end
end
return expired
