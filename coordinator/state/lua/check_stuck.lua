-- ARGV[3] soft floor ms, ARGV[4] soft factor, ARGV[5] hard floor ms, ARGV[6] hard factor.
-- A leased task running past max(floor, factor x its kind's mean time) is flagged once (task_stuck); past
-- the hard limit it fails on its worker (a new fence: the worker hears STALE and stops) and queues again.
-- Returns {flagged ids, cancelled ids}.
local soft_floor, soft_factor = tonumber(ARGV[3]), tonumber(ARGV[4])
local hard_floor, hard_factor = tonumber(ARGV[5]), tonumber(ARGV[6])
local flagged, cancelled = {}, {}
for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'state', 'worker', 'render', 'leased_ms', 'kind', 'stuck_ms')
  if t[1] == 'leased' then
    local stats = redis.call('HMGET', key('kindtime', t[5]), 'n', 'sum_ms')
    local n = tonumber(stats[1]) or 0
    local mean = n > 0 and (tonumber(stats[2]) or 0) / n or 0
    local running = NOW - (tonumber(t[4]) or NOW)
    local hard = math.max(hard_floor, hard_factor * mean)
    local soft = math.max(soft_floor, soft_factor * mean)
    if running > hard then
      local err = string.format('stuck on %s: ran %.1f s, past the hard limit %.1f s', t[2], running / 1000,
        hard / 1000)
      task_failed(tid, t[2], err, 'transient')  -- a hang may be the Mac's (asleep, swapping)
      cancelled[#cancelled + 1] = tid
    elseif running > soft and (tonumber(t[6]) or 0) == 0 then
      redis.call('HSET', tk, 'stuck_ms', NOW)
      emit(t[3], {type = 'task_stuck', task = tid, worker = t[2], running_ms = running,
        expected_ms = math.floor(mean), limit_ms = math.floor(soft)})
      flagged[#flagged + 1] = tid
    end
  end
end
return {flagged, cancelled}
