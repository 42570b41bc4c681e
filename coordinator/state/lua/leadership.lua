-- The coordinators' leadership lease. ARGV[3] node id (random per process), ARGV[4] the address it
-- serves on, ARGV[5] lease ms (0 = resign). The holder renews with its node id; anyone takes a lapsed
-- or free lease, and every change of holder bumps the epoch that fenced scripts check (common.lua).
-- Returns {1 if the caller leads else 0, epoch, leader address ('' if none), deadline ms}.
local lk = key('leader')
local node, address, ttl = ARGV[3], ARGV[4], tonumber(ARGV[5])
local cur = redis.call('HMGET', lk, 'node', 'address', 'epoch', 'deadline_ms')
local epoch = tonumber(cur[3]) or 0
local deadline = tonumber(cur[4]) or 0
if ttl == 0 then
  if cur[1] == node then
    redis.call('HSET', lk, 'node', '', 'address', '', 'deadline_ms', 0)
    return {0, epoch, '', 0}
  end
  return {0, epoch, cur[2] or '', deadline}
end
local mine = cur[1] == node
if not mine and cur[1] and cur[1] ~= '' and deadline > NOW then
  return {0, epoch, cur[2] or '', deadline}
end
if not mine then
  -- A new holder: bump the epoch, so the previous holder's fenced writes are refused from now on.
  epoch = redis.call('HINCRBY', lk, 'epoch', 1)
end
deadline = NOW + ttl
redis.call('HSET', lk, 'node', node, 'address', address, 'deadline_ms', deadline, 'since_ms',
  mine and (redis.call('HGET', lk, 'since_ms') or NOW) or NOW)
return {1, epoch, address, deadline}
