-- ARGV[3] render id, ARGV[4] tasks JSON. Returns how many were added (0 on a stopped render).
local rid = ARGV[3]
local state = redis.call('HGET', key('render', rid), 'state')
if not state then return redis.error_reply('farm: no render ' .. rid) end
if TERMINAL[state] then return 0 end
local fresh = {}
for _, t in ipairs(cjson.decode(ARGV[4])) do
  -- A repeated add is a no-op for the tasks this render already has.
  if redis.call('HGET', key('task', t.id), 'render') ~= rid then fresh[#fresh + 1] = t end
end
if #fresh == 0 then return 0 end
local err = check_new_tasks(rid, fresh)
if err then return redis.error_reply(err) end
emit(rid, {type = 'tasks_added', count = #fresh})
insert_tasks(rid, fresh)
return #fresh
