-- ARGV[3] worker id, ARGV[4] info JSON, ARGV[5] '1' when a running agent registers again after losing
-- its coordinator. Counters survive a re-registration; a drain mark survives only a resumed one.
local wk = key('worker', ARGV[3])
redis.call('HSET', wk, 'info', ARGV[4], 'registered_ms', NOW, 'last_seen_ms', NOW, 'state', 'idle',
  'current_task', '')
if ARGV[5] ~= '1' then redis.call('HSET', wk, 'drain', 0) end
for _, f in ipairs({'tasks_done', 'failures', 'busy_ms'}) do redis.call('HSETNX', wk, f, 0) end
redis.call('SADD', key('workers'), ARGV[3])
return 1
