-- Shared helpers, prepended by store.py to every script so each rule lives in one place.
-- ARGV[1] = key prefix, ARGV[2] = events MAXLEN; a script's own arguments start at ARGV[3].
-- TIME is read before any write, so ask 6.2 for effects replication (7 always does it).
if redis.replicate_commands then redis.replicate_commands() end

local P = ARGV[1]
local MAXLEN = ARGV[2]
local TERMINAL = {done = true, failed = true, cancelled = true}

local function key(...)
  return P .. ':' .. table.concat({...}, ':')
end

local NOW = (function()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end)()

-- Leadership fence: a coordinator passes its leadership epoch as KEYS[1] (the scripts build their keys
-- from ARGV, so KEYS is free for it). Once another coordinator has taken the lease, the epoch has
-- moved on and every write of the old leader is refused here, before it touches anything.
if KEYS[1] and KEYS[1] ~= (redis.call('HGET', key('leader'), 'epoch') or '') then
  return redis.error_reply('farm: not the leader (epoch ' .. KEYS[1] .. ' is over)')
end

local function emit(render, ev)
  ev.ts = NOW
  return redis.call('XADD', key('events', render), 'MAXLEN', '~', MAXLEN, '*', 'e', cjson.encode(ev))
end

local function render_active(render)
  local s = redis.call('HGET', key('render', render), 'state')
  return s and not TERMINAL[s]
end

-- The worker must hold the task's current lease: the fence is the proof. Returns the task's render, and
-- the values of any further fields asked for (read in the same call: {t[5], ...}).
local function holder_render(tid, worker, fence, ...)
  local t = redis.call('HMGET', key('task', tid), 'state', 'worker', 'fence', 'render', ...)
  if t[1] ~= 'leased' or t[2] ~= worker or t[3] ~= fence then return nil end
  return t[4], {unpack(t, 5)}
end

-- Ready queues are sorted sets: higher render priority first, then the tasks the planner marked `lead`
-- (a chunked render's chain of windows: coordinator/plan/graph.py mark_lead), then FIFO by a queue
-- sequence number; a task pushed to the front (a retry, an expiry) takes a negative number and goes
-- before the rest of its part of the band. Sequence numbers stay far below LEAD_SPAN.
local PRIORITY_SPAN = 1e12
local LEAD_SPAN = 5e11

local function ready_score(priority, qseq, lead)
  return -(tonumber(priority) or 0) * PRIORITY_SPAN - (tostring(lead) == '1' and LEAD_SPAN or 0) + qseq
end

local function push_ready(tid, front)
  local t = redis.call('HMGET', key('task', tid), 'capability', 'render', 'lead')
  local seq = redis.call('INCR', key('qseq'))
  if front then seq = -seq end
  redis.call('HSET', key('task', tid), 'qseq', seq)
  local priority = redis.call('HGET', key('render', t[2]), 'priority')
  redis.call('ZADD', key('ready', t[1]), ready_score(priority, seq, t[3]), tid)
  redis.call('SADD', key('capabilities'), t[1])
end

-- The farm's event feed (the dashboard's): workers lost, leases lost, tasks retried, workers
-- blocklisted, draining and drained; one capped stream beside the renders' own.
local FEED_MAXLEN = 2000
local function feed(ev)
  ev.ts = NOW
  return redis.call('XADD', key('feed'), 'MAXLEN', '~', FEED_MAXLEN, '*', 'e', cjson.encode(ev))
end

-- Every lease that ended, for the schedule (the dashboard's Gantt): who ran which attempt of a task
-- from when to when and how it ended ('done', 'failed', 'lost', 'expired', 'requeued', 'cancelled'):
-- in the render's list and in the farm's, scored by its end and kept ATTEMPTS_KEEP_MS.
local ATTEMPTS_KEEP_MS = 2 * 3600 * 1000

-- The workers a lease ran on: a gang's every rank (gang.lua writes `ranks`, rank 0 first, the holder),
-- else the holder alone. Rank 0 reports for all, but every rank computed: the record names them all.
local function task_ranks(tid, worker)
  local out = {}
  for w in string.gmatch(redis.call('HGET', key('task', tid), 'ranks') or '', '%S+') do out[#out + 1] = w end
  if #out < 2 or out[1] ~= worker then return {worker} end
  return out
end

local function record_attempt(tid, worker, leased_ms, how)
  local t = redis.call('HMGET', key('task', tid), 'render', 'kind', 'attempts')
  local ranks = task_ranks(tid, worker)
  for r, w in ipairs(ranks) do  -- one row per rank: one bar per rank on the schedule
    local row = cjson.encode({task = tid, render = t[1] or '', kind = t[2] or '', worker = w,
      attempt = tonumber(t[3]) or 0, start_ms = tonumber(leased_ms) or NOW, end_ms = NOW, outcome = how,
      rank = #ranks > 1 and r - 1 or nil})
    if t[1] then redis.call('RPUSH', key('render', t[1], 'attempts'), row) end
    redis.call('ZADD', key('attempts'), NOW, row)
  end
  redis.call('ZREMRANGEBYSCORE', key('attempts'), '-inf', NOW - ATTEMPTS_KEEP_MS)
end

-- End a lease: drop the deadline and book the worker's time (outcome: 'done', 'failed' or nil; `how`
-- names what ended it otherwise, for the schedule: 'lost', 'expired', 'requeued', 'cancelled').
local function release(tid, worker, leased_ms, outcome, how)
  record_attempt(tid, worker, leased_ms, outcome or how or 'cancelled')
  redis.call('ZREM', key('leases'), tid)
  local wk = key('worker', worker)
  redis.call('HINCRBY', wk, 'busy_ms', math.max(0, NOW - (tonumber(leased_ms) or NOW)))
  if outcome == 'done' then redis.call('HINCRBY', wk, 'tasks_done', 1) end
  if outcome == 'failed' then redis.call('HINCRBY', wk, 'failures', 1) end
  if redis.call('HGET', wk, 'current_task') == tid then
    redis.call('HSET', wk, 'state', 'idle', 'current_task', '')
  end
end

-- A worker's own call (lease, heartbeat, result) is its liveness: state, current task, last seen, and a
-- place in the fleet. Folded into those scripts so a transition is one round trip (seen = ARGV flag '1';
-- the coordinator's reducer leases under its own id and stays out of the fleet).
local function worker_seen(worker, state, current)
  redis.call('HSET', key('worker', worker), 'state', state, 'current_task', current, 'last_seen_ms', NOW)
  redis.call('SADD', key('workers'), worker)
end

-- Take a stopped render's not-yet-leased tasks out of the ready queues.
local function drop_queued(render)
  for _, tid in ipairs(redis.call('LRANGE', key('render', render, 'tasks'), 0, -1)) do
    local tk = key('task', tid)
    local t = redis.call('HMGET', tk, 'state', 'capability')
    if t[1] == 'queued' then redis.call('ZREM', key('ready', t[2]), tid) end
    if t[1] == 'queued' or t[1] == 'waiting' then redis.call('HSET', tk, 'state', 'cancelled') end
  end
end

-- Space-separated word lists: a task's failed_on workers, a render's blocklist, a worker's blocklisted renders.
local function has_word(s, w)
  for x in string.gmatch(s or '', '%S+') do if x == w then return true end end
  return false
end

local function add_word(s, w)
  if has_word(s, w) then return s end
  if not s or s == '' then return w end
  return s .. ' ' .. w
end

local function drop_word(s, w)
  local out = {}
  for x in string.gmatch(s or '', '%S+') do if x ~= w then out[#out + 1] = x end end
  return table.concat(out, ' ')
end

-- A render that ended (done, failed, cancelled) needs no assembly and blocklists no worker any more;
-- its own record keeps the blocklist it ended with.
local function unlist_blocklist(render)
  for w in string.gmatch(redis.call('HGET', key('render', render), 'blocklist') or '', '%S+') do
    local wk = key('worker', w)
    redis.call('HSET', wk, 'blocklisted', drop_word(redis.call('HGET', wk, 'blocklisted'), render))
  end
end

local function render_ended(render)
  redis.call('SREM', key('to_assemble'), render)
  unlist_blocklist(render)
end

local function fail_render(render, tid, err)
  redis.call('HSET', key('render', render), 'state', 'failed', 'error', err, 'finished_ms', NOW)
  drop_queued(render)
  render_ended(render)
  emit(render, {type = 'render_failed', task = tid, error = err})
end

-- {name: {"blob": sha} | {"task": id, "output": name}} -> JSON {name: sha}, or nil and why.
local function resolve_inputs(tid)
  local refs = cjson.decode(redis.call('HGET', key('task', tid), 'input_refs'))
  local out = {}
  for name, ref in pairs(refs) do
    if ref.blob then
      out[name] = ref.blob
    else
      local outs = redis.call('HGET', key('task', ref.task), 'outputs')
      local sha = outs and cjson.decode(outs)[ref.output]
      if type(sha) ~= 'string' then
        return nil, 'input ' .. name .. ' of ' .. tid .. ': task ' .. ref.task .. ' has no output ' .. ref.output
      end
      out[name] = sha
    end
  end
  return cjson.encode(out)
end

-- All deps are done: resolve inputs and queue the task (or fail the render on a dangling ref).
local function make_ready(tid, render)
  local inputs, err = resolve_inputs(tid)
  local tk = key('task', tid)
  if not inputs then
    redis.call('HSET', tk, 'state', 'failed', 'error', err)
    fail_render(render, tid, err)
    return
  end
  redis.call('HSET', tk, 'state', 'queued', 'inputs', inputs, 'queued_ms', NOW)
  push_ready(tid, false)
  local t = redis.call('HMGET', tk, 'kind', 'capability')
  emit(render, {type = 'task_queued', task = tid, kind = t[1], capability = t[2]})
end

-- Tasks may not reuse an id, and deps must name tasks of this render (in the batch or stored).
local function check_new_tasks(rid, tasks)
  local batch = {}
  for _, t in ipairs(tasks) do
    if batch[t.id] or redis.call('EXISTS', key('task', t.id)) == 1 then
      return 'farm: task ' .. t.id .. ' already exists'
    end
    batch[t.id] = true
  end
  for _, t in ipairs(tasks) do
    for _, d in ipairs(t.deps) do
      if not batch[d] and redis.call('HGET', key('task', d), 'render') ~= rid then
        return 'farm: task ' .. t.id .. ' depends on unknown task ' .. d
      end
    end
  end
  return nil
end

-- Of tasks to add to a render, those it does not have yet (a repeated add is a no-op for the rest).
local function fresh_tasks(rid, tasks)
  local fresh = {}
  for _, t in ipairs(tasks) do
    if redis.call('HGET', key('task', t.id), 'render') ~= rid then fresh[#fresh + 1] = t end
  end
  return fresh
end

local function insert_tasks(rid, tasks)
  local tl = key('render', rid, 'tasks')
  local base = redis.call('LLEN', tl)
  for i, t in ipairs(tasks) do
    redis.call('HSET', key('task', t.id), 'render', rid, 'kind', t.kind, 'params', t.params,
      'input_refs', t.input_refs, 'inputs', '{}', 'deps', t.deps_json, 'capability', t.capability,
      'state', 'waiting', 'attempts', 0, 'max_attempts', t.max_attempts, 'worker', '', 'fence', 0,
      'outputs', '{}', 'error', '', 'leased_ms', 0, 'deadline_ms', 0, 'queued_ms', 0, 'done_ms', 0,
      'metrics', '{}', 'progress', '{}', 'seq', base + i - 1,
      'failures', 0, 'failed_on', '', 'lost', 0, 'stuck_ms', 0, 'session', '', 'lead', t.lead or 0)
    redis.call('RPUSH', tl, t.id)
  end
  -- Wire deps once every hash exists (a dep may sit later in the same batch).
  local ready = {}
  for i, t in ipairs(tasks) do
    local pending = 0
    for _, d in ipairs(t.deps) do
      if redis.call('HGET', key('task', d), 'state') ~= 'done' then
        pending = pending + 1
        redis.call('ZADD', key('task', d, 'dependents'), base + i - 1, t.id)
      end
    end
    redis.call('SET', key('task', t.id, 'pending'), pending)
    if pending == 0 then ready[#ready + 1] = t.id end
  end
  local rk = key('render', rid)
  redis.call('HINCRBY', rk, 'remaining', #tasks)
  redis.call('HINCRBY', rk, 'total', #tasks)
  for _, tid in ipairs(ready) do
    if render_active(rid) then make_ready(tid, rid) end
  end
end

-- ---------------------------------------------------------------- failure policy (a render farm's)
-- A task lost with its worker (crash, cut cable, sleep) spends no attempt; a task that raises spends one
-- on that worker; a worker failing BLOCKLIST_AFTER tasks of a render leases none of it any more; a render
-- fails when a task failed on max_attempts distinct workers, or when no live worker is left to run it.
local BLOCKLIST_AFTER = 3
local LIVE_MS = 90000  -- a worker unseen this long cannot be counted on (the dashboard's "lost")

-- A task whose worker vanishes this many times is taken to be what kills them (a poison task: out of
-- memory, a crash in the model): its render fails with that line instead of taking down every Mac in
-- turn forever. Generous, because a Mac that sleeps or drops off the network loses leases too.
local LOST_LIMIT = 8

-- Back to the front of its queue with a new fence (the old holder is stale at once), no attempt spent.
-- event: 'task_lost' (its connection broke) or 'task_expired' (its lease deadline passed).
local LEASE_ENDS = {task_lost = 'lost', task_expired = 'expired'}  -- the schedule's word for each
local function lose_task(tid, event, reason)
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'state', 'worker', 'render', 'leased_ms', 'attempts', 'capability')
  if t[1] ~= 'leased' then
    redis.call('ZREM', key('leases'), tid)
    return false
  end
  redis.call('HSET', tk, 'fence', redis.call('INCR', key('fence')))
  release(tid, t[2], t[4], nil, LEASE_ENDS[event])
  feed({type = 'lease_lost', task = tid, worker = t[2], render = t[3], how = event, reason = reason})
  local lost = redis.call('HINCRBY', tk, 'lost', 1)
  redis.call('HINCRBY', key('worker', t[2]), 'lost', 1)
  if not render_active(t[3]) then
    redis.call('HSET', tk, 'state', 'cancelled')
    return true
  end
  if lost >= LOST_LIMIT and t[6] ~= 'coordinator' then  -- the coordinator's own reclaims are not the task's fault
    local why = 'task ' .. tid .. ' lost its worker ' .. lost .. ' times (last: ' .. reason ..
      '); it may be what crashes them'
    redis.call('HSET', tk, 'state', 'failed', 'error', reason, 'done_ms', NOW)
    emit(t[3], {type = event, task = tid, worker = t[2], attempt = tonumber(t[5]), reason = reason})
    fail_render(t[3], tid, why)
    return true
  end
  redis.call('HSET', tk, 'state', 'queued', 'error', reason, 'queued_ms', NOW)
  push_ready(tid, true)
  emit(t[3], {type = event, task = tid, worker = t[2], attempt = tonumber(t[5]), reason = reason})
  return true
end

-- A worker's determinism class (ltx_engine/fingerprint.py): the fingerprint it registered ('' if none).
-- Workers of one class compute the fixed tiny forward to the same bits; lease.lua and gang.lua deal the
-- tiles of one step and the ranks of one gang within one class.
local function class_of(info_json)
  local ok, info = pcall(cjson.decode, info_json or '')
  return ok and type(info) == 'table' and type(info.fingerprint) == 'string' and info.fingerprint or ''
end

-- Whether a live worker (seen lately, not lost, refused or draining) of class `cls` is registered.
local function class_alive(cls)
  for _, w in ipairs(redis.call('SMEMBERS', key('workers'))) do
    local h = redis.call('HMGET', key('worker', w), 'state', 'last_seen_ms', 'drain', 'info')
    if h[1] ~= 'lost' and h[1] ~= 'refused' and h[3] ~= '1' and NOW - (tonumber(h[2]) or 0) <= LIVE_MS
        and class_of(h[4]) == cls then
      return true
    end
  end
  return false
end

local function blocklisted(render, worker)
  return has_word(redis.call('HGET', key('render', render), 'blocklist'), worker)
end

-- Count a failure of `worker` on `render`; blocklist it for the render at BLOCKLIST_AFTER.
local function note_worker_failure(render, worker)
  local n = redis.call('HINCRBY', key('render', render, 'wfail'), worker, 1)
  if n < BLOCKLIST_AFTER or blocklisted(render, worker) then return end
  local rk, wk = key('render', render), key('worker', worker)
  redis.call('HSET', rk, 'blocklist', add_word(redis.call('HGET', rk, 'blocklist'), worker))
  redis.call('HSET', wk, 'blocklisted', add_word(redis.call('HGET', wk, 'blocklisted'), render))
  emit(render, {type = 'worker_blocklisted', worker = worker, failures = n})
  feed({type = 'worker_blocklisted', worker = worker, render = render, failures = n})
end

-- An operator gives the render's blocklisted workers another chance (farm requeue, the dashboard).
local function clear_blocklist(render)
  unlist_blocklist(render)
  redis.call('HSET', key('render', render), 'blocklist', '')
  redis.call('DEL', key('render', render, 'wfail'))
  emit(render, {type = 'blocklist_cleared'})
end

-- Registered workers that are live and not blocklisted for the render.
local function runnable_workers(render)
  local out = {}
  for _, w in ipairs(redis.call('SMEMBERS', key('workers'))) do
    local h = redis.call('HMGET', key('worker', w), 'state', 'last_seen_ms', 'drain')
    local live = h[1] ~= 'lost' and h[1] ~= 'refused' and h[3] ~= '1' and NOW - (tonumber(h[2]) or 0) <= LIVE_MS
    if live and not blocklisted(render, w) then out[#out + 1] = w end
  end
  return out
end

-- Why the render must stop after this failure, or nil while it can go on.
local function fatal_reason(tid, render, failed_on, max_attempts, err)
  local n = 0
  for _ in string.gmatch(failed_on, '%S+') do n = n + 1 end
  if n >= max_attempts then
    return 'task ' .. tid .. ' failed on ' .. n .. ' workers (' .. failed_on .. '): ' .. err
  end
  if redis.call('HGET', key('task', tid), 'capability') ~= 'coordinator' and #runnable_workers(render) == 0 then
    local bl = redis.call('HGET', key('render', render), 'blocklist') or ''
    return 'no worker left can run ' .. tid .. ' (blocklisted: ' .. (bl ~= '' and bl or 'none') ..
      '): ' .. err
  end
  return nil
end

-- The one line when the failure is the task's own, so every worker would hit it (nil: it may be the
-- worker's): the worker classed it permanent (the engine refused its input), or a second worker raised
-- the very error another did. A fault the worker classed transient (memory, a killed process, I/O, a
-- lost peer) is never the task's. The task's fault_error / fault_worker keep the last unclassed one.
local function task_fault(tid, worker, err, fault)
  if fault == 'permanent' then return err end
  if fault == 'transient' then return nil end
  local t = redis.call('HMGET', key('task', tid), 'fault_error', 'fault_worker')
  if t[1] == err and t[2] and t[2] ~= '' and t[2] ~= worker then
    return 'the same error on ' .. t[2] .. ' and ' .. worker .. ': ' .. err
  end
  redis.call('HSET', key('task', tid), 'fault_error', err, 'fault_worker', worker)
  return nil
end

-- A leased task raised on `worker` (or its result was refused, or it ran stuck): spend an attempt.
-- fault: 'permanent', 'transient' or 'unknown' (the worker's class of the error, worker/faults.py).
-- An error every worker would hit fails the render at once, blocklists nobody, and marks the render
-- fails_again (retry_render.lua then refuses: only another spec can help).
-- Returns 'requeued', 'failed' or 'stale' (its render already stopped).
local function task_failed(tid, worker, err, fault)
  local tk = key('task', tid)
  local t = redis.call('HMGET', tk, 'leased_ms', 'attempts', 'max_attempts', 'failed_on', 'render')
  local render = t[5]
  redis.call('HSET', tk, 'fence', redis.call('INCR', key('fence')))
  release(tid, worker, t[1], 'failed')
  if not render_active(render) then
    redis.call('HSET', tk, 'state', 'cancelled', 'error', err)
    return 'stale'
  end
  local failed_on = add_word(t[4], worker)
  redis.call('HINCRBY', tk, 'failures', 1)
  redis.call('HSET', tk, 'failed_on', failed_on)
  local own = task_fault(tid, worker, err, fault)
  if own then  -- no worker was to blame: those it blocklisted on this render are cleared
    redis.call('HSET', key('render', render), 'fails_again', '1')
    if (redis.call('HGET', key('render', render), 'blocklist') or '') ~= '' then clear_blocklist(render) end
  else
    note_worker_failure(render, worker)
  end
  local attempt = tonumber(t[2])
  local why = own or fatal_reason(tid, render, failed_on, tonumber(t[3]), err)
  if why then
    redis.call('HSET', tk, 'state', 'failed', 'error', err, 'done_ms', NOW)
    emit(render, {type = 'task_failed', task = tid, worker = worker, attempt = attempt, error = err})
    feed({type = 'task_failed', task = tid, worker = worker, render = render, error = err})
    fail_render(render, tid, why)
    return 'failed'
  end
  redis.call('HSET', tk, 'state', 'queued', 'error', err, 'queued_ms', NOW)
  push_ready(tid, true)  -- to the front: the rest of its step is waiting on it
  emit(render, {type = 'task_retry', task = tid, worker = worker, attempt = attempt, error = err})
  feed({type = 'task_retried', task = tid, worker = worker, render = render, error = err})
  return 'requeued'
end
