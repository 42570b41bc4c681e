-- ARGV[3] worker, ARGV[4] lease ms, ARGV[5] '1' when a worker asks (the call is its liveness, see
-- common.lua worker_seen), ARGV[6..] capabilities in preference order.
-- Returns {task id, the task's hash as a flat list}, or nil when nothing is ready: the whole lease in one
-- round trip, the reply carrying everything the worker needs.
-- ARGV[5] 'peek': the task this call would lease, by the same rules, leasing and moving nothing
-- (FarmWorker.Upcoming: the inputs a busy worker prefetches must be those of its next lease); then
-- ARGV[6] is a JSON list of task ids to step over (guessed for other workers) and capabilities follow.
local worker = ARGV[3]
local lease_ms = tonumber(ARGV[4])
local seen = ARGV[5] == '1'
local peek = ARGV[5] == 'peek'
local passed, first_cap = {}, 6
if peek then
  first_cap = 7
  for _, tid in ipairs(cjson.decode(ARGV[6])) do passed[tid] = true end
end
-- The worker's own fields, read once (nothing below changes them before the lease is written).
local W = redis.call('HMGET', key('worker', worker), 'drain', 'info', 'models', 'session', 'refused')
if (seen or peek) and W[5] and W[5] ~= '' then return false end  -- refused at registration (another project version)
if W[1] == '1' then  -- draining: no more
  if seen and redis.call('HGET', key('worker', worker), 'state') ~= 'drained' then
    feed({type = 'worker_drained', worker = worker})
  end
  if seen then worker_seen(worker, 'drained', '') end
  return false
end
-- The components of each pack the worker holds ({pack: [component, ...]}, from its registration),
-- or nil when it describes none (it may take any task).
-- Likewise the text encoders it holds ({name: bytes}), or nil when it describes none.
local function worker_holdings()
  local ok, info = pcall(cjson.decode, W[2] or '')
  if not ok or type(info) ~= 'table' then return nil, nil, nil end
  local packs = type(info.pack_components) == 'table' and info.pack_components or nil
  local encoders = type(info.text_encoders) == 'table' and info.text_encoders or nil
  return packs, encoders, tonumber(info.memory_bytes)
end
local holdings, encoders, memory = worker_holdings()
local my_class = class_of(W[2])

-- Whether the worker holds the task's text encoder under one of the names it may have
-- (params.text_encoder_names, set only when the encoder is not the pack's own).
local function holds_encoder(params)
  if type(params.text_encoder_names) ~= 'table' or not encoders then return true end
  for _, name in ipairs(params.text_encoder_names) do
    if encoders[name] then return true end
  end
  return false
end

-- A task's kind, queued_ms and params, read and decoded once per call (nothing here changes them).
-- decoded: its params as the checks read them (a broken params field stops the call, as it always did).
local infos = {}
local function task_info(tid)
  if not infos[tid] then
    local t = redis.call('HMGET', key('task', tid), 'kind', 'params', 'queued_ms')
    local ok, params = pcall(cjson.decode, t[2] or '{}')
    infos[tid] = {kind = t[1], queued_ms = t[3], stored = t[2] ~= false, ok = ok, params = params}
  end
  return infos[tid]
end
local function decoded(tid)
  local info = task_info(tid)
  if not info.ok then error(info.params) end
  return info.params
end

-- Whether the worker holds what the task loads (params.needs of params.pack, and its text encoder).
local function holds_needs(tid)
  local params = decoded(tid)
  if not holds_encoder(params) then return false end
  -- The cost model's predicted peak (coordinator/plan/costs.py) must fit this worker's usable memory.
  -- A DiT task whose resident peak does not fit may still: streamed (its blocks read one at a time).
  local need = tonumber(params.min_memory_bytes)
  if memory and need and need > memory then
    local stream = tonumber(params.min_memory_stream_bytes)
    if not stream or stream > memory then return false end
  end
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

-- Scheduling policy (set_policy.lua; `farm bench dealing|affinity` turn parts off to measure them):
-- dealing / affinity / fairshare '0' = off; weight:<submitter> = that submitter's fair-share weight (default 1).
local POLICY = {}
do
  local flat = redis.call('HGETALL', key('policy'))
  for i = 1, #flat, 2 do POLICY[flat[i]] = flat[i + 1] end
end

-- Warm-model affinity: the models the worker's last task left loaded (complete.lua records them).
-- A worker whose first eligible task would load models prefers, among the next AFFINITY_LOOKAHEAD
-- queued tasks of the same render priority and submitter, one whose models it holds warm, unless the
-- first has waited AFFINITY_WAIT_MS already (no task starves behind warmer ones).
local AFFINITY_LOOKAHEAD, AFFINITY_WAIT_MS = 8, 5000
local warm = {}
if POLICY.affinity ~= '0' then
  local ok, models = pcall(cjson.decode, W[3] or '[]')
  if ok and type(models) == 'table' then
    for _, m in ipairs(models) do warm[m] = true end
  end
end
local function is_warm(tid)
  local params = decoded(tid)
  if type(params.warm) == 'table' then  -- a DiT with the render's LoRA set (protos/lora_set.py)
    for _, m in ipairs(params.warm) do
      if not warm[m] then return false end
    end
  end
  if type(params.needs) ~= 'table' or #params.needs == 0 then return true end
  for _, c in ipairs(params.needs) do
    if not warm[c] then return false end
  end
  return true
end

-- Each render's state, active flag (common.lua render_active), priority and submitter (create_render.lua
-- records it from the spec), read once per call.
local renders = {}
local function render_info(render)
  if not renders[render] then
    local r = redis.call('HMGET', key('render', render), 'priority', 'submitter', 'state', 'any_class')
    renders[render] = {state = r[3], active = r[3] and not TERMINAL[r[3]], priority = r[1], submitter = r[2] or '',
      any_class = r[4] == '1'}
  end
  return renders[render]
end
local function submitter_of(render)
  return render_info(render).submitter
end

-- The kinds whose outputs are cached under params.text_key: a prompt's embeddings, an enhanced prompt.
local function cached_kind(kind) return kind == 'text_encode' or kind == 'enhance_prompt' end
-- The prompt-embedding cache: a queued text task whose embeddings (same pack, prompt and encoder: its
-- params.text_key) a finished text task left (complete.lua keeps them) is not encoded again: it moves to
-- the coordinator's queue with those blobs as its inputs, and the reducer hands them on as its outputs.
-- While a text task with the same key runs, the others wait for it. Returns 'moved', 'wait' or nil.
local function text_shortcut(q, tid)
  local info = task_info(tid)
  if not cached_kind(info.kind) or q == key('ready', 'coordinator') then return nil end
  local params = info.params
  local k = info.stored and info.ok and type(params) == 'table' and params.text_key
  if type(k) ~= 'string' then return nil end
  local cached = redis.call('HGET', key('textcache'), k)
  if cached then
    for _, sha in pairs(cjson.decode(cached)) do
      if redis.call('EXISTS', key('blob', sha)) == 0 then cached = nil end  -- collected since: encode again
    end
  end
  if cached then
    if peek then return 'moved' end  -- it would go to the coordinator's queue, not to this worker
    redis.call('ZREM', q, tid)
    redis.call('HSET', key('task', tid), 'capability', 'coordinator', 'inputs', cached)
    push_ready(tid, false)
    return 'moved'
  end
  if not peek then redis.call('HDEL', key('textcache'), k) end
  local holder = redis.call('HGET', key('textholder'), k)
  if holder and holder ~= tid and redis.call('HGET', key('task', holder), 'state') == 'leased' then return 'wait' end
  return nil
end
-- The text task a worker takes is the one that encodes its key; the others wait for its result.
local function claim_text(tid)
  local info = task_info(tid)
  local params = info.params
  if cached_kind(info.kind) and info.stored and info.ok and type(params) == 'table'
      and type(params.text_key) == 'string' then
    redis.call('HSET', key('textholder'), params.text_key, tid)
  end
end

-- Determinism classes (common.lua class_of): the tiles of one step (a tile task's id less its `.t<i>`)
-- go to the class of the worker that took its first tile (stepclass:<render> {step: class}), so a
-- render's bits depend only on its spec and the classes it ran on. A render submitted with --any-class
-- mixes them; a step whose class has no live worker left goes on with another (else it waits forever:
-- the render's provenance then shows both classes).
local function tile_step(tid)
  if decoded(tid).tile_index == nil then return nil end
  return string.match(tid, '^(.*)%.t%d+$')
end
-- The class a tile's step is held to: nil when it is no tile, its step has no class yet, or the render
-- mixes classes.
local function step_class(tid, render)
  if not seen or render_info(render).any_class then return nil end
  local step = tile_step(tid)
  return step and redis.call('HGET', key('stepclass', render), step) or nil
end
local function class_declines(tid, render)
  local cls = step_class(tid, render)
  return cls ~= nil and cls ~= my_class and class_alive(cls)
end

-- Speed-aware dealing (coordinator/plan/placement.py deal_takes is this rule in Python, held against it by
-- tests/farm/test_dealing.py). A step ends when its slowest tile does, so a worker asking for a tile
-- (params.tile_index) of a step takes one only when dealing the step's queued tiles one by one to
-- whoever finishes each soonest (when it is free + its seconds for the tile: the cost model's ratios
-- complete.lua learns per worker and kind) gives it one now; else the tile waits for faster peers.
-- A peer must beat the asker by DEAL_MARGIN, and a tile that has waited as long as the asker would
-- take it goes to the asker anyway (a peer that is not coming cannot hold a step up).
local DEAL_MARGIN = 0.9
local function ratio(w, kind)
  return tonumber(redis.call('HGET', key('costratio', w), kind))
end
-- Seconds until peer `w` (fields state, last_seen_ms, drain, current_task, info) is free, or nil when
-- it cannot be counted on (lost, draining, unseen, too small for the task).
local function free_in(w, h, need)
  if h[1] == 'lost' or h[1] == 'refused' or h[3] == '1' or NOW - (tonumber(h[2]) or 0) > LIVE_MS then return nil end
  local ok, info = pcall(cjson.decode, h[5] or '')
  if need and ok and type(info) == 'table' and tonumber(info.memory_bytes) and tonumber(info.memory_bytes) < need then
    return nil
  end
  if h[1] ~= 'busy' or not h[4] or h[4] == '' then return 0 end
  local t = redis.call('HMGET', key('task', h[4]), 'kind', 'params', 'leased_ms')
  local okp, params = pcall(cjson.decode, t[2] or '')
  local cost = okp and type(params) == 'table' and tonumber(params.cost_s) or 0
  local left = (tonumber(t[3]) or NOW) / 1000 + cost * (ratio(w, t[1] or '') or 1) - NOW / 1000
  return math.max(0, left)
end
-- Queued tiles of the task's step, from it on in queue order.
local function step_queued(q, tid, render, step)
  local n = 0
  local rank = redis.call('ZRANK', q, tid)
  for _, other in ipairs(redis.call('ZRANGE', q, rank, rank + 63)) do
    local t = redis.call('HMGET', key('task', other), 'state', 'render', 'params')
    local ok, params = pcall(cjson.decode, t[3] or '')
    if t[2] ~= render or not ok or params.step ~= step or params.tile_index == nil then break end
    if t[1] == 'queued' then n = n + 1 end
  end
  return n
end
local function deal_declines(q, tid, render)
  if POLICY.dealing == '0' then return false end
  local info, params = task_info(tid), decoded(tid)
  local cost, own_ratio = tonumber(params.cost_s), ratio(worker, info.kind)
  if params.tile_index == nil or not cost or not own_ratio then return false end
  local own = cost * own_ratio
  if NOW - (tonumber(info.queued_ms) or NOW) >= own * 1000 then return false end
  local limit, before, cls = own * DEAL_MARGIN, 0, step_class(tid, render)
  for _, w in ipairs(redis.call('SMEMBERS', key('workers'))) do
    local r = w ~= worker and ratio(w, info.kind)
    if r and not blocklisted(render, w) and redis.call('EXISTS', key('gangof', w)) == 0 then  -- held: no peer
      local h = redis.call('HMGET', key('worker', w), 'state', 'last_seen_ms', 'drain', 'current_task', 'info')
      local free = free_in(w, h, tonumber(params.min_memory_stream_bytes) or tonumber(params.min_memory_bytes))
      if free and cls and class_of(h[5]) ~= cls then free = nil end  -- a peer the step's class rules out
      if free and free + cost * r < limit then
        before = before + math.ceil((limit - free) / (cost * r)) - 1
      end
    end
  end
  return before > 0 and before >= step_queued(q, tid, render, params.step)
end

local function warmer_task(q, first, render)
  if next(warm) == nil or is_warm(first) then return nil end
  local waited = NOW - (tonumber(task_info(first).queued_ms) or NOW)
  if waited > AFFINITY_WAIT_MS then return nil end
  local priority = render_info(render).priority
  local rank = redis.call('ZRANK', q, first)
  for _, tid in ipairs(redis.call('ZRANGE', q, rank + 1, rank + AFFINITY_LOOKAHEAD)) do
    local t = redis.call('HMGET', key('task', tid), 'state', 'render')
    local r = t[2] and render_info(t[2])
    if t[1] == 'queued' and r and r.active and r.priority == priority and r.submitter == submitter_of(render)
        and not passed[tid] and not blocklisted(t[2], worker) and holds_needs(tid) and is_warm(tid)
        and not class_declines(tid, t[2]) and not deal_declines(q, tid, t[2]) and not text_shortcut(q, tid) then
      return tid
    end
  end
  return nil
end

-- Fair share: among the first eligible task of each submitter in the top priority band, the one whose
-- submitter holds the fewest leases per unit of weight (ties: queue order). FAIR_LOOKAHEAD bounds the scan.
local FAIR_LOOKAHEAD = 64  -- queued tasks looked at past the first eligible one
local function shares()
  local held = {}
  for _, tid in ipairs(redis.call('ZRANGE', key('leases'), 0, -1)) do
    local s = submitter_of(redis.call('HGET', key('task', tid), 'render') or '')
    held[s] = (held[s] or 0) + 1
  end
  return function(s)
    return (held[s] or 0) / math.max(tonumber(POLICY['weight:' .. s]) or 1, 1e-6)
  end
end
local share_of  -- computed at most once per call, and only when two submitters compete
local function share(s)
  share_of = share_of or shares()
  return share_of(s)
end
-- Whether the scan may stop at its first eligible task: fair share is off, the farm has only ever had
-- one submitter (create_render.lua's set: no one else can have a task here), or that task's submitter
-- holds no lease (no one can have a smaller share, and ties keep queue order). The first two spare
-- the look at every lease and the FAIR_LOOKAHEAD tasks past the first, most of a lease's cost.
local function first_is_fairest(first)
  return POLICY.fairshare == '0' or redis.call('SCARD', key('submitters')) == 1 or share(first.submitter) == 0
end
local function fairest(firsts)
  if #firsts == 1 or POLICY.fairshare == '0' then return firsts[1] end
  local best = firsts[1]
  for _, f in ipairs(firsts) do
    if share(f.submitter) < share(best.submitter) then best = f end
  end
  return best
end

-- The task this worker takes from queue q: queue order among tasks of active renders that have not
-- blocklisted it, whose needs it holds and that dealing leaves it, by fair share between submitters
-- (or a warmer one just behind it, above). Entries of stopped renders leave the queue on the way.
local function next_task(q)
  local pos, after, firsts, seen, band, size = 0, 0, {}, {}, nil, 8
  while after < FAIR_LOOKAHEAD do
    local batch = redis.call('ZRANGE', q, pos, pos + size - 1)  -- a few first: the scan mostly stops at one
    size = 64
    if #batch == 0 then break end
    for _, tid in ipairs(batch) do
      local t = redis.call('HMGET', key('task', tid), 'state', 'render')
      local r = t[2] and render_info(t[2])
      local shortcut = t[1] == 'queued' and r and r.active and not seen[r.submitter] and text_shortcut(q, tid)
      if shortcut == 'moved' then
        shortcut = nil  -- left this queue: the next entry now sits at pos
        if peek then pos = pos + 1 end  -- a peek moved nothing: step over it
      elseif t[1] == 'queued' and r and r.active then
        pos = pos + 1
        if band then after = after + 1 end
        if band and r.priority ~= band then after = FAIR_LOOKAHEAD end
        if after >= FAIR_LOOKAHEAD then break end
        if shortcut ~= 'wait' and not seen[r.submitter] and not passed[tid] and not blocklisted(t[2], worker)
            and holds_needs(tid) and not class_declines(tid, t[2]) and not deal_declines(q, tid, t[2]) then
          seen[r.submitter], band = true, r.priority
          firsts[#firsts + 1] = {tid = tid, render = t[2], submitter = r.submitter}
          -- A submitter holding no lease has the smallest share there is: no later one can beat it.
          local fairest_yet = #firsts == 1 and first_is_fairest(firsts[1]) or #firsts > 1 and share(r.submitter) == 0
          if fairest_yet then after = FAIR_LOOKAHEAD; break end
        end
      elseif peek then
        pos = pos + 1  -- a stopped render's entry: the lease drops it, a peek leaves it
      else
        redis.call('ZREM', q, tid)
        if t[1] == 'queued' then redis.call('HSET', key('task', tid), 'state', 'cancelled') end
      end
    end
  end
  if #firsts == 0 then return nil end
  local pick = fairest(firsts)
  local tid = warmer_task(q, pick.tid, pick.render) or pick.tid
  if peek then return tid end
  redis.call('ZREM', q, tid)
  claim_text(tid)
  return tid
end

-- Lease `tid` to this worker, or to `who` (a gang's rank 0, which holds the lease for its members).
local function grant(tid, who)
  local worker = who or worker
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'state', 'render', 'attempts')
  local fence = redis.call('INCR', key('fence'))
  local attempt = tonumber(t[3]) + 1
  local deadline = NOW + lease_ms
  -- The holder's own session: lose_leases.lua matches it when that worker's connection breaks (a gang
  -- that fills on a joining member's ask is granted to rank 0, not to the asker).
  local session = (who and redis.call('HGET', key('worker', who), 'session') or W[4]) or ''
  redis.call('HSET', tk, 'state', 'leased', 'worker', worker, 'fence', fence, 'attempts', attempt,
    'leased_ms', NOW, 'deadline_ms', deadline, 'progress', '{}', 'session', session, 'stuck_ms', 0)
  redis.call('ZADD', key('leases'), deadline, tid)
  redis.call('HDEL', tk, 'gang', 'gang_ended', 'ranks')  -- a gang's handout is written after its grant
  local step = seen and not who and tile_step(tid)
  if step then redis.call('HSETNX', key('stepclass', t[2]), step, my_class) end  -- the step's class
  if seen and not who then
    worker_seen(worker, 'busy', tid)
  else
    redis.call('HSET', key('worker', worker), 'state', 'busy', 'current_task', tid, 'last_seen_ms', NOW)
  end
  if render_info(t[2]).state == 'queued' then
    redis.call('HSET', key('render', t[2]), 'state', 'running', 'started_ms', NOW)
    emit(t[2], {type = 'render_state', state = 'running'})
  end
  emit(t[2], {type = 'task_leased', task = tid, worker = worker, attempt = attempt, fence = fence,
    leased_ms = NOW, deadline_ms = deadline})
  return {tid, redis.call('HGETALL', tk)}
end

-- Gang leases (the rule in Python: coordinator/plan/sp_degree.py gang_degree): sequence-
-- parallel stage 1 on k workers at once, all or none, in this one script.
local GANG = {grant = grant, task_info = task_info, holds_needs = holds_needs, render_info = render_info,
  worker = worker, class = my_class, waiting = function() if seen then worker_seen(worker, 'idle', '') end end, queues = {}}
for i = first_cap, #ARGV do GANG.queues[ARGV[i]] = true end
if seen then  -- a worker asks (the coordinator's own reducer never gangs)
  local gang_lease = gang_poll(GANG)
  if gang_lease ~= nil then return gang_lease end
end

for i = first_cap, #ARGV do
  local tid = next_task(key('ready', ARGV[i]))
  if peek and tid then return {tid, redis.call('HGETALL', key('task', tid))} end
  if tid then
    if seen and gang_open(GANG, tid) == false then return false end  -- it waits in a reservation
    return grant(tid)
  end
end
if seen then worker_seen(worker, 'idle', '') end
return false
