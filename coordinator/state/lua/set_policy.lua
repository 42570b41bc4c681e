-- ARGV[3..] field, value pairs of the scheduling policy lease.lua reads: dealing / affinity / fairshare ('0' = off,
-- '1' = on) and weight:<submitter> (a fair-share weight > 0). An empty value removes the field (the
-- default: on, weight 1). Returns the policy as a flat list.
local pk = key('policy')
for i = 3, #ARGV - 1, 2 do
  if ARGV[i + 1] == '' then redis.call('HDEL', pk, ARGV[i]) else redis.call('HSET', pk, ARGV[i], ARGV[i + 1]) end
end
return redis.call('HGETALL', pk)
