-- ARGV[3] render id, ARGV[4] tasks JSON. Returns how many were added (0 on a stopped render).
local rid = ARGV[3]
local state = redis.call('HGET', key('render', rid), 'state')
if not state then return redis.error_reply('farm: no render ' .. rid) end
if TERMINAL[state] then return 0 end
local fresh = fresh_tasks(rid, cjson.decode(ARGV[4]))
if #fresh == 0 then return 0 end
local err = check_new_tasks(rid, fresh)
if err then return redis.error_reply(err) end
emit(rid, {type = 'tasks_added', count = #fresh})
insert_tasks(rid, fresh)
return #fresh
