-- ARGV[3] worker id, ARGV[4] info JSON. Counters survive a re-registration.
local wk = key('worker', ARGV[3])
redis.call('HSET', wk, 'info', ARGV[4], 'registered_ms', NOW, 'last_seen_ms', NOW, 'state', 'idle',
  'current_task', '')
for _, f in ipairs({'tasks_done', 'failures', 'busy_ms'}) do redis.call('HSETNX', wk, f, 0) end
redis.call('SADD', key('workers'), ARGV[3])
return 1
