-- ARGV[3] render id, ARGV[4] priority (integer). 1 when set, 0 when missing or finished.
local rid = ARGV[3]
local state = redis.call('HGET', key('render', rid), 'state')
if not state or TERMINAL[state] then return 0 end
redis.call('HSET', key('render', rid), 'priority', tonumber(ARGV[4]))
for _, tid in ipairs(redis.call('LRANGE', key('render', rid, 'tasks'), 0, -1)) do
  local t = redis.call('HMGET', key('task', tid), 'state', 'capability', 'qseq', 'lead')
  if t[1] == 'queued' then
    redis.call('ZADD', key('ready', t[2]), 'XX', ready_score(ARGV[4], tonumber(t[3]) or 0, t[4]), tid)
  end
end
emit(rid, {type = 'render_priority', priority = tonumber(ARGV[4])})
return 1
