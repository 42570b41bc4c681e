-- ARGV[3] render id, ARGV[4] spec JSON, ARGV[5] priority, ARGV[6] tasks JSON. 1 = created, 0 = existed.
local rid = ARGV[3]
local rk = key('render', rid)
if redis.call('EXISTS', rk) == 1 then return 0 end
local tasks = cjson.decode(ARGV[6])
local err = check_new_tasks(rid, tasks)
if err then return redis.error_reply(err) end
redis.call('HSET', rk, 'spec', ARGV[4], 'state', 'queued', 'stage', '', 'error', '', 'output', '',
  'created_ms', NOW, 'started_ms', 0, 'finished_ms', 0, 'remaining', 0, 'total', 0, 'priority', ARGV[5])
local ok, spec = pcall(cjson.decode, ARGV[4])  -- whose share of the fleet its tasks count against (lease.lua)
local submitter = ok and type(spec) == 'table' and spec.submitter
submitter = type(submitter) == 'string' and submitter or ''
redis.call('HSET', rk, 'submitter', submitter)
-- --any-class: its tiles and gangs may mix determinism classes (lease.lua class_declines, gang.lua).
if ok and type(spec) == 'table' and spec.any_class == true then redis.call('HSET', rk, 'any_class', '1') end
-- Every submitter that ever had a render here (lease.lua: while there is one, fair share has nobody to
-- weigh). A farm from before this set builds it from the renders it holds, the first time.
local sk = key('submitters')
if redis.call('EXISTS', sk) == 0 then
  for _, r in ipairs(redis.call('ZRANGE', key('renders'), 0, -1)) do
    redis.call('SADD', sk, redis.call('HGET', key('render', r), 'submitter') or '')
  end
end
redis.call('SADD', sk, submitter)
redis.call('ZADD', key('renders'), NOW, rid)
emit(rid, {type = 'render_queued', tasks = #tasks, priority = tonumber(ARGV[5])})
insert_tasks(rid, tasks)
return 1
