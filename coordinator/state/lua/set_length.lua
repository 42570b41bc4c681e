-- ARGV[3] render id, ARGV[4] plan task id, ARGV[5] its holder, ARGV[6] fence, ARGV[7] spec JSON,
-- ARGV[8] frames, ARGV[9] seconds, ARGV[10] tasks JSON.
-- An LTX-2.5 render's DurationHead picked its length: record the spec with it, say so, and add the rest
-- of the stage graph, in one step (tasks it already has are skipped, so a retry is a no-op). Only the
-- plan task's current holder may: 'stale' otherwise. Returns how many tasks were added (0: stopped).
local rid = ARGV[3]
if holder_render(ARGV[4], ARGV[5], ARGV[6]) ~= rid then return 'stale' end
if not render_active(rid) then return 0 end
local fresh = fresh_tasks(rid, cjson.decode(ARGV[10]))
local err = check_new_tasks(rid, fresh)
if err then return redis.error_reply(err) end
local rk = key('render', rid)
if redis.call('HGET', rk, 'spec') ~= ARGV[7] then
  redis.call('HSET', rk, 'spec', ARGV[7])
  emit(rid, {type = 'length_chosen', frames = tonumber(ARGV[8]), seconds = tonumber(ARGV[9]),
    frame_rate = cjson.decode(ARGV[7]).frame_rate})
end
if #fresh == 0 then return 0 end
emit(rid, {type = 'tasks_added', count = #fresh})
insert_tasks(rid, fresh)
return #fresh
