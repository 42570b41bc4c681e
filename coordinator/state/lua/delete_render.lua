-- ARGV[3] render id. Forget a finished render: its hash, task graph, gangs, events, blocklist and schedule rows.
-- Returns 'deleted', 'missing', or the state of a render still running (cancel it first).
local rid = ARGV[3]
local rk = key('render', rid)
local state = redis.call('HGET', rk, 'state')
if not state then return 'missing' end
if not TERMINAL[state] then return state end
local caps = redis.call('SMEMBERS', key('capabilities'))
for _, tid in ipairs(redis.call('LRANGE', key('render', rid, 'tasks'), 0, -1)) do
  redis.call('DEL', key('task', tid), key('task', tid, 'dependents'), key('task', tid, 'pending'))
  redis.call('ZREM', key('leases'), tid)
  redis.call('DEL', key('gang', tid))  -- a gang whose members never asked again
  redis.call('SREM', key('gangs'), tid)
  for _, cap in ipairs(caps) do redis.call('ZREM', key('ready', cap), tid) end
end
for _, row in ipairs(redis.call('LRANGE', key('render', rid, 'attempts'), 0, -1)) do
  redis.call('ZREM', key('attempts'), row)  -- the farm's schedule forgets it too
end
redis.call('DEL', rk, key('render', rid, 'tasks'), key('events', rid), key('render', rid, 'wfail'),
  key('render', rid, 'attempts'), key('stepclass', rid))
redis.call('ZREM', key('renders'), rid)
redis.call('SREM', key('to_assemble'), rid)
return 'deleted'
