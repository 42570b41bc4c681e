-- ARGV[3] render id, ARGV[4] priority (integer). 1 when set, 0 when missing or finished.
local rid = ARGV[3]
local state = redis.call('HGET', key('render', rid), 'state')
if not state or TERMINAL[state] then return 0 end
redis.call('HSET', key('render', rid), 'priority', tonumber(ARGV[4]))
emit(rid, {type = 'render_priority', priority = tonumber(ARGV[4])})
return 1
