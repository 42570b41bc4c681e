-- ARGV[3] render id, ARGV[4] state, ARGV[5] JSON {field: string}. 0 when missing or already finished.
local rid, state = ARGV[3], ARGV[4]
local rk = key('render', rid)
local cur = redis.call('HGET', rk, 'state')
if not cur or TERMINAL[cur] then return 0 end
local ev = {type = 'render_state', state = state, previous = cur}
redis.call('HSET', rk, 'state', state)
for f, v in pairs(cjson.decode(ARGV[5])) do
  redis.call('HSET', rk, f, v)
  ev[f] = v
end
if TERMINAL[state] then
  redis.call('HSET', rk, 'finished_ms', NOW)
  if state ~= 'done' then drop_queued(rid) end
  render_ended(rid)
end
emit(rid, ev)
return 1
