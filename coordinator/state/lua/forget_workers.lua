-- ARGV[3] a time in ms. Forget workers last seen before it that hold no lease: their hash and their
-- place in the workers set (a Mac that comes back registers again). Returns the ids forgotten.
local cutoff = tonumber(ARGV[3])
local held = {}
for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
  local w = redis.call('HGET', key('task', tid), 'worker')
  if w then held[w] = true end
end
local gone = {}
for _, wid in ipairs(redis.call('SMEMBERS', key('workers'))) do
  local seen = tonumber(redis.call('HGET', key('worker', wid), 'last_seen_ms') or '0')
  if seen < cutoff and not held[wid] then
    redis.call('DEL', key('worker', wid))
    redis.call('SREM', key('workers'), wid)
    table.insert(gone, wid)
  end
end
return gone
