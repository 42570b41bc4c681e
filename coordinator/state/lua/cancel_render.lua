-- ARGV[3] render id. 1 when it was stopped now, 0 when missing or already finished.
local rid = ARGV[3]
local state = redis.call('HGET', key('render', rid), 'state')
if not state or TERMINAL[state] then return 0 end
redis.call('HSET', key('render', rid), 'state', 'cancelled', 'finished_ms', NOW)
drop_queued(rid)
render_ended(rid)
emit(rid, {type = 'render_cancelled', previous = state})
return 1
