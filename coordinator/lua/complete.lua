-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] outputs JSON, ARGV[7] metrics JSON.
local tid, worker = ARGV[3], ARGV[4]
local render = holder_render(tid, worker, ARGV[5])
if not render then return 'stale' end
local tk = key('task', tid)
local t = redis.call('HMGET', tk, 'leased_ms', 'attempts')
if not render_active(render) then
  -- The render stopped while this ran: the result is not wanted.
  redis.call('HSET', tk, 'state', 'cancelled')
  release(tid, worker, t[1], nil)
  return 'stale'
end
redis.call('HSET', tk, 'state', 'done', 'outputs', ARGV[6], 'metrics', ARGV[7], 'done_ms', NOW, 'error', '')
release(tid, worker, t[1], 'done')
local remaining = redis.call('HINCRBY', key('render', render), 'remaining', -1)
emit(render, {type = 'task_done', task = tid, worker = worker, attempt = tonumber(t[2]),
  outputs = cjson.decode(ARGV[6]), metrics = cjson.decode(ARGV[7]), remaining = remaining})
-- Dependents are scored by plan position, so they queue in plan order.
for _, d in ipairs(redis.call('ZRANGE', key('task', tid, 'dependents'), 0, -1)) do
  local left = redis.call('DECR', key('task', d, 'pending'))
  if left == 0 and redis.call('HGET', key('task', d), 'state') == 'waiting' and render_active(render) then
    make_ready(d, render)
  end
end
-- Each kind's mean lease-to-done time: what check_stuck.lua measures a running task against.
local kt = key('kindtime', redis.call('HGET', tk, 'kind'))
redis.call('HINCRBY', kt, 'n', 1)
redis.call('HINCRBY', kt, 'sum_ms', math.max(0, NOW - (tonumber(t[1]) or NOW)))
-- The cost model's running estimate (coordinator/costs.py): lease-to-done over the task's reference
-- seconds (params.cost_s), an EWMA per worker and kind, and fleet-wide per kind.
local ok, params = pcall(cjson.decode, redis.call('HGET', tk, 'params') or '')
local cost = ok and type(params) == 'table' and tonumber(params.cost_s) or nil
if cost and cost > 0 then
  local kind = redis.call('HGET', tk, 'kind')
  local ratio = math.max(0, NOW - (tonumber(t[1]) or NOW)) / 1000 / cost
  for _, hk in ipairs({key('costratio', worker), key('costratio_fleet')}) do
    local old = tonumber(redis.call('HGET', hk, kind))
    redis.call('HSET', hk, kind, string.format('%.6g', old and (0.6 * old + 0.4 * ratio) or ratio))
  end
end
if remaining <= 0 and render_active(render) then
  redis.call('SADD', key('to_assemble'), render)  -- until it ends: the sweep resumes a broken assembly
  return 'render_ready'
end
return 'ok'
