-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] outputs JSON, ARGV[7] metrics JSON, ARGV[8] '1' when
-- the worker reports it (its liveness too: idle now, common.lua worker_seen) — one round trip per result.
local tid, worker = ARGV[3], ARGV[4]
if ARGV[8] == '1' then worker_seen(worker, 'idle', '') end
local render, t = holder_render(tid, worker, ARGV[5], 'leased_ms', 'attempts', 'kind', 'params', 'capability')
if not render then return 'stale' end
local tk = key('task', tid)
if not render_active(render) then
  -- The render stopped while this ran: the result is not wanted.
  redis.call('HSET', tk, 'state', 'cancelled')
  release(tid, worker, t[1], nil, 'cancelled')
  return 'stale'
end
redis.call('HSET', tk, 'state', 'done', 'outputs', ARGV[6], 'metrics', ARGV[7], 'done_ms', NOW, 'error', '')
-- Provenance: which code, libraries and hardware produced this output (the worker's registration).
local okw, winfo = pcall(cjson.decode, redis.call('HGET', key('worker', worker), 'info') or '')
if okw and type(winfo) == 'table' then
  local made = {worker = worker}
  for _, f in ipairs({'chip', 'backend', 'project_version', 'mlx_version', 'fingerprint', 'installed'}) do
    made[f] = winfo[f]
  end
  redis.call('HSET', tk, 'made_by', cjson.encode(made))
end
release(tid, worker, t[1], 'done')
local remaining = redis.call('HINCRBY', key('render', render), 'remaining', -1)
local ranks = task_ranks(tid, worker)  -- a gang's: every rank's worker
emit(render, {type = 'task_done', task = tid, worker = worker, attempt = tonumber(t[2]),
  workers = #ranks > 1 and ranks or nil,
  outputs = cjson.decode(ARGV[6]), metrics = cjson.decode(ARGV[7]), remaining = remaining})
-- Dependents are scored by plan position, so they queue in plan order.
for _, d in ipairs(redis.call('ZRANGE', key('task', tid, 'dependents'), 0, -1)) do
  local left = redis.call('DECR', key('task', d, 'pending'))
  if left == 0 and redis.call('HGET', key('task', d), 'state') == 'waiting' and render_active(render) then
    make_ready(d, render)
  end
end
-- Each kind's mean lease-to-done time: what check_stuck.lua measures a running task against.
local kt = key('kindtime', t[3])
redis.call('HINCRBY', kt, 'n', 1)
redis.call('HINCRBY', kt, 'sum_ms', math.max(0, NOW - (tonumber(t[1]) or NOW)))
-- The cost model's running estimates (coordinator/plan/costs.py), EWMAs per worker and kind and fleet-wide
-- per kind: lease-to-done less model loading over the task's reference seconds (params.cost_s), and
-- the loading seconds of a cold start; the worker's warm models (what placement's affinity reads).
local function ewma(hk, field, value)
  local old = tonumber(redis.call('HGET', hk, field))
  redis.call('HSET', hk, field, string.format('%.6g', old and (0.6 * old + 0.4 * value) or value))
end
local ok, params = pcall(cjson.decode, t[4] or '')
local okm, measured = pcall(cjson.decode, ARGV[7])
measured = okm and type(measured) == 'table' and measured or {}
local cost = ok and type(params) == 'table' and tonumber(params.cost_s) or nil
-- The prompt-embedding cache (lease.lua's text_shortcut): a text task's outputs under its key. One the
-- coordinator handed on from the cache encoded nothing, so it teaches the cost model nothing either.
local text_key = ok and type(params) == 'table' and type(params.text_key) == 'string' and params.text_key
if text_key then
  redis.call('HSET', key('textcache'), text_key, ARGV[6])
  if t[5] == 'coordinator' then cost = nil end
end
if cost and cost > 0 then
  local kind = t[3]
  local load = math.max(0, tonumber(measured.load_s) or 0)
  local ratio = math.max(0, (NOW - (tonumber(t[1]) or NOW)) / 1000 - load) / cost
  ewma(key('costratio', worker), kind, ratio)
  ewma(key('costratio_fleet'), kind, ratio)
  if load > 0 then
    ewma(key('costload', worker), kind, load)
    ewma(key('costload_fleet'), kind, load)
  end
end
if type(measured.models) == 'table' then
  redis.call('HSET', key('worker', worker), 'models', cjson.encode(measured.models))
end
if remaining <= 0 and render_active(render) then
  redis.call('SADD', key('to_assemble'), render)  -- until it ends: the sweep resumes a broken assembly
  return 'render_ready'
end
return 'ok'
