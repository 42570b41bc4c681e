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
if state == 'assembling' then redis.call('HSET', rk, 'assembling_ms', NOW) end
-- The cost model's assembly ratio (coordinator/plan/costs.py assemble_seconds): measured / reference seconds.
local since = tonumber(redis.call('HGET', rk, 'assembling_ms'))
local ok, spec = pcall(cjson.decode, redis.call('HGET', rk, 'spec') or '')
local ref = ok and type(spec) == 'table' and tonumber(spec.assemble_s) or nil
if state == 'done' and since and ref and ref > 0 then
  local hk, ratio = key('costratio', 'coordinator'), (NOW - since) / 1000 / ref
  local old = tonumber(redis.call('HGET', hk, 'assemble'))
  redis.call('HSET', hk, 'assemble', string.format('%.6g', old and (0.6 * old + 0.4 * ratio) or ratio))
end
if TERMINAL[state] then
  redis.call('HSET', rk, 'finished_ms', NOW)
  if state ~= 'done' then drop_queued(rid) end
  render_ended(rid)
end
if state == 'done' then  -- nothing in a finished render runs again (only failed/cancelled ones are retried):
  -- its dependency counters and lists and the unresolved inputs go, so it keeps one hash per task
  for _, tid in ipairs(redis.call('LRANGE', key('render', rid, 'tasks'), 0, -1)) do
    redis.call('DEL', key('task', tid, 'pending'), key('task', tid, 'dependents'))
    redis.call('HDEL', key('task', tid), 'input_refs', 'qseq')
  end
end
emit(rid, ev)
return 1
