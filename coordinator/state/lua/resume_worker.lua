-- ARGV[3] worker id. Undo a drain before the worker has left (the dashboard's resume button): lease.lua
-- gives it tasks again, and its next heartbeat or lease reply tells it to stay. Returns 1, or 0 when no
-- such worker is draining (unknown, not draining, or already exited: start that one again instead).
local wk = key('worker', ARGV[3])
if redis.call('SISMEMBER', key('workers'), ARGV[3]) == 0 then return 0 end
local h = redis.call('HMGET', wk, 'drain', 'state')
if h[1] ~= '1' or h[2] == 'drained' or h[2] == 'lost' then return 0 end
redis.call('HSET', wk, 'drain', 0)
return 1
