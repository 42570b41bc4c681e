-- ARGV[3] render id. A finished render's webhook is sent once: 1 when this call claimed it (the caller
-- sends it now), 0 when it is missing, still running, or was claimed before.
local rk = key('render', ARGV[3])
local state = redis.call('HGET', rk, 'state')
if not state or not TERMINAL[state] then return 0 end
if redis.call('HSETNX', rk, 'notified_ms', NOW) == 0 then return 0 end
return 1
