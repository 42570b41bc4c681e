-- ARGV[3] worker, ARGV[4] lease ms, ARGV[5..] capabilities in preference order.
-- Returns {task id, the task's hash as a flat list}, or nil when nothing is ready.
local worker = ARGV[3]
local lease_ms = tonumber(ARGV[4])
if redis.call('HGET', key('worker', worker), 'drain') == '1' then return false end  -- draining: no more
-- The components of each pack the worker holds ({pack: [component, ...]}, from its registration),
-- or nil when it describes none (it may take any task).
-- Likewise the text encoders it holds ({name: bytes}), or nil when it describes none.
local function worker_holdings()
  local ok, info = pcall(cjson.decode, redis.call('HGET', key('worker', worker), 'info') or '')
  if not ok or type(info) ~= 'table' then return nil, nil, nil end
  local packs = type(info.pack_components) == 'table' and info.pack_components or nil
  local encoders = type(info.text_encoders) == 'table' and info.text_encoders or nil
  return packs, encoders, tonumber(info.memory_bytes)
end
local holdings, encoders, memory = worker_holdings()

-- Whether the worker holds the task's text encoder under one of the names it may have
-- (params.text_encoder_names, set only when the encoder is not the pack's own).
local function holds_encoder(params)
  if type(params.text_encoder_names) ~= 'table' or not encoders then return true end
  for _, name in ipairs(params.text_encoder_names) do
    if encoders[name] then return true end
  end
  return false
end

-- Whether the worker holds what the task loads (params.needs of params.pack, and its text encoder).
local function holds_needs(tid)
  local params = cjson.decode(redis.call('HGET', key('task', tid), 'params') or '{}')
  if not holds_encoder(params) then return false end
  -- The cost model's predicted peak (coordinator/costs.py) must fit this worker's usable memory.
  if memory and tonumber(params.min_memory_bytes) and tonumber(params.min_memory_bytes) > memory then return false end
  if not holdings or type(params.needs) ~= 'table' then return true end
  local held = holdings[params.pack]
  if type(held) ~= 'table' then return false end
  local have = {}
  for _, c in ipairs(held) do have[c] = true end
  for _, c in ipairs(params.needs) do
    if not have[c] then return false end
  end
  return true
end

-- Warm-model affinity: the models the worker's last task left loaded (complete.lua records them).
-- A worker whose first eligible task would load models prefers, among the next AFFINITY_LOOKAHEAD
-- queued tasks of the same render priority, one whose models it holds warm, unless the first has
-- waited AFFINITY_WAIT_MS already (no task starves behind warmer ones).
local AFFINITY_LOOKAHEAD, AFFINITY_WAIT_MS = 8, 5000
local warm = {}
do
  local ok, models = pcall(cjson.decode, redis.call('HGET', key('worker', worker), 'models') or '[]')
  if ok and type(models) == 'table' then
    for _, m in ipairs(models) do warm[m] = true end
  end
end
local function is_warm(tid)
  local params = cjson.decode(redis.call('HGET', key('task', tid), 'params') or '{}')
  if type(params.needs) ~= 'table' or #params.needs == 0 then return true end
  for _, c in ipairs(params.needs) do
    if not warm[c] then return false end
  end
  return true
end
local function warmer_task(q, first, render)
  if next(warm) == nil or is_warm(first) then return nil end
  local waited = NOW - (tonumber(redis.call('HGET', key('task', first), 'queued_ms')) or NOW)
  if waited > AFFINITY_WAIT_MS then return nil end
  local priority = redis.call('HGET', key('render', render), 'priority')
  local rank = redis.call('ZRANK', q, first)
  for _, tid in ipairs(redis.call('ZRANGE', q, rank + 1, rank + AFFINITY_LOOKAHEAD)) do
    local t = redis.call('HMGET', key('task', tid), 'state', 'render')
    if t[1] == 'queued' and render_active(t[2]) and redis.call('HGET', key('render', t[2]), 'priority') == priority
        and not blocklisted(t[2], worker) and holds_needs(tid) and is_warm(tid) then
      return tid
    end
  end
  return nil
end

-- The first queued task, in queue order, of a render that has not blocklisted this worker and
-- whose needs its packs hold (or a warmer one just behind it, above).
local function next_task(q)
  local skipped = 0
  while true do
    local batch = redis.call('ZRANGE', q, skipped, skipped + 63)
    if #batch == 0 then return nil end
    for _, tid in ipairs(batch) do
      local t = redis.call('HMGET', key('task', tid), 'state', 'render')
      if t[1] == 'queued' and render_active(t[2]) and not blocklisted(t[2], worker) and holds_needs(tid) then
        tid = warmer_task(q, tid, t[2]) or tid
        redis.call('ZREM', q, tid)
        return tid
      elseif t[1] == 'queued' and render_active(t[2]) then
        skipped = skipped + 1  -- stays queued for the other workers
      else
        redis.call('ZREM', q, tid)
        if t[1] == 'queued' then redis.call('HSET', key('task', tid), 'state', 'cancelled') end
      end
    end
  end
end

for i = 5, #ARGV do
  local tid = next_task(key('ready', ARGV[i]))
  if tid then
    local tk = key('task', tid)
    local t = redis.call('HMGET', tk, 'state', 'render', 'attempts')
    local fence = redis.call('INCR', key('fence'))
    local attempt = tonumber(t[3]) + 1
    local deadline = NOW + lease_ms
    local session = redis.call('HGET', key('worker', worker), 'session') or ''
    redis.call('HSET', tk, 'state', 'leased', 'worker', worker, 'fence', fence, 'attempts', attempt,
      'leased_ms', NOW, 'deadline_ms', deadline, 'progress', '{}', 'session', session, 'stuck_ms', 0)
    redis.call('ZADD', key('leases'), deadline, tid)
    redis.call('HSET', key('worker', worker), 'state', 'busy', 'current_task', tid, 'last_seen_ms', NOW)
    local rk = key('render', t[2])
    if redis.call('HGET', rk, 'state') == 'queued' then
      redis.call('HSET', rk, 'state', 'running', 'started_ms', NOW)
      emit(t[2], {type = 'render_state', state = 'running'})
    end
    emit(t[2], {type = 'task_leased', task = tid, worker = worker, attempt = attempt, fence = fence,
      leased_ms = NOW, deadline_ms = deadline})
    return {tid, redis.call('HGETALL', tk)}
  end
end
return false
