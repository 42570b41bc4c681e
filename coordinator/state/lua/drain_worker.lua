-- ARGV[3] worker id. Mark the worker draining: lease.lua gives it no task from now on, its lease and
-- heartbeat replies tell it to finish what it runs and exit; register_worker.lua clears the mark.
-- Returns 1, or 0 when no worker has that id.
if redis.call('SISMEMBER', key('workers'), ARGV[3]) == 0 then return 0 end
if redis.call('HGET', key('worker', ARGV[3]), 'drain') ~= '1' then feed({type = 'worker_draining', worker = ARGV[3]}) end
redis.call('HSET', key('worker', ARGV[3]), 'drain', 1)
return 1
