-- ARGV[3] worker id, ARGV[4] the worker's pack copy progress JSON ({pack: {state, bytes, total, ...}}).
-- Only a registered worker's record is written; it shows on the dashboard and in `farm pack list`.
local wk = key('worker', ARGV[3])
if redis.call('EXISTS', wk) == 0 then return 0 end
redis.call('HSET', wk, 'pack_sync', ARGV[4], 'pack_sync_ms', NOW)
return 1
