-- Gang leases: a sequence-parallel stage-1 task (params.stage1_degrees, its degree table
-- fixed at submit) leased to k workers at once, all or none, inside lease.lua's one call. The rule is
-- coordinator/plan/sp_degree.py `gang_degree` (the fleet simulation follows it too):
--   open:  the first idle worker whose next task is such a task opens a reservation on it (the task
--          leaves its ready queue), wanting k = the table's degree for the workers idle then (itself
--          plus the live idle workers in no reservation that hold the task's pack). k < 2: plain lease.
--   join:  an idle worker that asks joins an open reservation whose task it can run, instead of work.
--   start: when it is full or gang_window_ms (2000) has passed since it opened (on a member's ask), it
--          starts with the members it has: 1 member = a plain lease; k > 1 = the members ranked fastest
--          first (gang_by_pace; equal ones in join order, the opener first), the task leased to
--          rank 0 with the handout (members, host:port per rank, deadlines) on the task; each
--          member gets the task and its rank on its next ask.
--   stale: a reservation no member asked about for 3 windows (its members gone) puts the task back.
-- The task keeps `ranks` (every rank's worker, rank 0 first) for its record: attempts, events, views.
-- Keys: gang:<task> {phase open|started, members, cap, opened_ms, fence, handed, class}, gangs (open ones),
-- gangof:<worker> = the task of the reservation it is in.
-- Ports: below both systems' ephemeral ranges (Linux 32768-60999, macOS 49152-65535), so no outgoing
-- connection's local port (nor its TIME_WAIT) can hold a rank's listening port; 47100 was inside Linux's.
local GANG_MAX, GANG_PORT_BASE, GANG_PORT_SPAN = 8, 31100, 800

local function gang_policy(name, default)
  return tonumber(redis.call('HGET', key('policy'), name)) or default
end

local function gang_words(s)
  local out = {}
  for w in string.gmatch(s or '', '%S+') do out[#out + 1] = w end
  return out
end

-- Idle live workers other than `me` that are in no reservation and hold `pack` (or describe nothing),
-- of determinism class `cls` (common.lua class_of; nil: any class).
local function gang_idle_peers(me, pack, cls)
  local n = 0
  for _, w in ipairs(redis.call('SMEMBERS', key('workers'))) do
    if w ~= me and redis.call('EXISTS', key('gangof', w)) == 0 then
      local h = redis.call('HMGET', key('worker', w), 'state', 'last_seen_ms', 'drain', 'info')
      local ok, info = pcall(cjson.decode, h[4] or '')
      local packs = ok and type(info) == 'table' and type(info.pack_components) == 'table' and info.pack_components
      local holds = not packs or packs[pack] ~= nil
      local alike = cls == nil or class_of(h[4]) == cls
      if h[1] == 'idle' and h[3] ~= '1' and NOW - (tonumber(h[2]) or 0) <= LIVE_MS and holds and alike then
        n = n + 1
      end
    end
  end
  return n
end

-- sp_degree.degree_for_idle: the table's degree for `idle` idle workers (past its end: its last entry).
local function gang_want(table_, idle)
  if type(table_) ~= 'table' or #table_ == 0 then return 1 end
  return math.max(1, tonumber(table_[math.min(math.max(idle, 1), #table_)]) or 1)
end

-- The host a rank listens on: what the worker registered (`sp_host`), else the address it called from.
local function gang_host(w)
  local ok, info = pcall(cjson.decode, redis.call('HGET', key('worker', w), 'info') or '')
  if ok and type(info) == 'table' then
    if type(info.sp_host) == 'string' and info.sp_host ~= '' then return info.sp_host end
    local peer = type(info.peer) == 'string' and info.peer or ''
    local host = string.match(peer, '^ipv4:([%d%.]+):%d+$')
    if host then return host end
  end
  return '127.0.0.1'
end

local function gang_dissolve(tid, members)
  redis.call('SREM', key('gangs'), tid)
  redis.call('DEL', key('gang', tid))
  for _, w in ipairs(members) do redis.call('DEL', key('gangof', w)) end
end

-- The member's reply: the task's hash with its rank (the servicer folds both into the lease reply).
local function gang_hand(tid, w)
  local gk = key('gang', tid)
  local members = gang_words(redis.call('HGET', gk, 'members'))
  local rank = 0
  for r, m in ipairs(members) do if m == w then rank = r - 1 end end
  redis.call('HSET', gk, 'handed', add_word(redis.call('HGET', gk, 'handed'), w))
  redis.call('HSET', key('worker', w), 'state', 'busy', 'current_task', tid, 'last_seen_ms', NOW)
  redis.call('SADD', key('workers'), w)
  local flat = redis.call('HGETALL', key('task', tid))
  flat[#flat + 1] = 'gang_rank'
  flat[#flat + 1] = tostring(rank)
  return {tid, flat}
end

-- A worker's speed against the fleet's (lower is faster): the median over the kinds it ran of its cost
-- ratio over the fleet's (complete.lua's EWMAs), leaving out `kind` (a gang's stage 1 is credited to
-- its rank 0 at the whole gang's speed); the fleet's own pace (1) when it has measured nothing else.
local function gang_pace(w, kind)
  local own, fleet = redis.call('HGETALL', key('costratio', w)), key('costratio_fleet')
  local rel = {}
  for i = 1, #own, 2 do
    local mine, all = tonumber(own[i + 1]), tonumber(redis.call('HGET', fleet, own[i]))
    if own[i] ~= kind and mine and all and all > 0 then rel[#rel + 1] = mine / all end
  end
  if #rel == 0 then return 1 end
  table.sort(rel)
  local mid = math.floor(#rel / 2)
  return #rel % 2 == 1 and rel[mid + 1] or (rel[mid] + rel[mid + 1]) / 2
end

-- The members fastest first (rank 0 holds the lease and finishes stage 1 alone if the gang breaks);
-- equal paces (the unmeasured ones) in join order, the opener first.
local function gang_by_pace(members, kind)
  local rows = {}
  for i, w in ipairs(members) do rows[i] = {w = w, i = i, pace = gang_pace(w, kind)} end
  table.sort(rows, function(a, b)
    if a.pace ~= b.pace then return a.pace < b.pace end
    return a.i < b.i
  end)
  local out = {}
  for i, row in ipairs(rows) do out[i] = row.w end
  return out
end

-- Start the reservation on `tid` with the members it has. Returns the lease when it went to one worker.
local function gang_start(G, tid)
  local gk = key('gang', tid)
  local members = gang_words(redis.call('HGET', gk, 'members'))
  local t = redis.call('HMGET', key('task', tid), 'state', 'render')
  redis.call('SREM', key('gangs'), tid)
  if t[1] ~= 'queued' or not (t[2] and G.render_info(t[2]).active) then
    gang_dissolve(tid, members)  -- cancelled while it gathered
    return nil
  end
  if #members < 2 then  -- nobody joined in the window: a plain lease
    gang_dissolve(tid, members)
    return G.grant(tid, members[1])
  end
  members = gang_by_pace(members, redis.call('HGET', key('task', tid), 'kind'))
  redis.call('HSET', gk, 'members', table.concat(members, ' '))
  -- A farm's first gang starts at a block of its own (a restarted farm's ports may still linger).
  redis.call('SETNX', key('gangseq'), math.floor(NOW / 1000) % (GANG_PORT_SPAN / GANG_MAX))
  local seq = redis.call('INCR', key('gangseq'))
  local hosts = {}
  for r, w in ipairs(members) do
    hosts[r] = gang_host(w) .. ':' .. (GANG_PORT_BASE + (seq * GANG_MAX + r - 1) % GANG_PORT_SPAN)
  end
  G.grant(tid, members[1])
  local fence = redis.call('HGET', key('task', tid), 'fence')
  local params = G.task_info(tid).params
  local steps = math.max(1, (type(params.sigmas) == 'table' and #params.sigmas or 2) - 1)
  local per_step = (tonumber(params.cost_s) or 0) / steps
  local handout = {degree = #members, members = members, hosts = hosts, fence = tonumber(fence),
    step_deadline_s = math.max(gang_policy('gang_step_floor_s', 10), per_step * gang_policy('gang_margin', 4)),
    open_deadline_s = gang_policy('gang_open_s', 20)}
  redis.call('HSET', key('task', tid), 'gang', cjson.encode(handout), 'ranks', table.concat(members, ' '))
  redis.call('HSET', gk, 'phase', 'started', 'fence', fence, 'handed', '')
  for i = 2, #members do
    redis.call('HSET', key('worker', members[i]), 'state', 'busy', 'current_task', tid, 'last_seen_ms', NOW)
  end
  emit(t[2], {type = 'gang_started', task = tid, degree = #members, members = members, hosts = hosts})
  return nil
end

-- The class a gang's members must share ('*': any, the render was submitted with --any-class).
local function gang_class(G, tid)
  local render = redis.call('HGET', key('task', tid), 'render') or ''
  return G.render_info(render).any_class and '*' or G.class
end

-- Open a reservation on `tid` (just taken from its queue) when it is a gang task and peers are idle.
-- Its ranks are of one determinism class: the opener's, unless the render mixes classes.
-- Returns false (this worker waits in it), or nil: lease it as usual.
local function gang_open(G, tid)
  local params = G.task_info(tid).params
  if type(params) ~= 'table' or type(params.stage1_degrees) ~= 'table' then return nil end
  local cls = gang_class(G, tid)
  local peers = gang_idle_peers(G.worker, params.pack, cls ~= '*' and cls or nil)
  local want = math.min(GANG_MAX, gang_want(params.stage1_degrees, 1 + peers))
  if want < 2 then return nil end
  local gk = key('gang', tid)
  redis.call('DEL', gk)
  redis.call('HSET', gk, 'phase', 'open', 'members', G.worker, 'cap', want, 'opened_ms', NOW, 'class', cls)
  redis.call('SADD', key('gangs'), tid)
  redis.call('SET', key('gangof', G.worker), tid)
  G.waiting()
  return false
end

-- A worker's ask, first: its own reservation (wait, start, or its handout), else joining an open one.
-- Returns a lease reply, false (wait), or nil (lease as usual).
local function gang_poll(G)
  local w, window = G.worker, gang_policy('gang_window_ms', 2000)
  local mine = redis.call('GET', key('gangof', w))
  if mine then
    local g = redis.call('HMGET', key('gang', mine), 'phase', 'members', 'opened_ms', 'cap', 'fence', 'handed')
    if g[1] == 'open' then
      if #gang_words(g[2]) >= tonumber(g[4]) or NOW - tonumber(g[3]) >= window then
        local single = gang_start(G, mine)
        if single then return single end
        if redis.call('HGET', key('gang', mine), 'phase') == 'started' then return gang_hand(mine, w) end
        redis.call('DEL', key('gangof', w))
        return nil
      end
      G.waiting()
      return false
    end
    local t = redis.call('HMGET', key('task', mine), 'state', 'fence')
    if g[1] == 'started' and t[1] == 'leased' and t[2] == g[5] and not has_word(g[6], w) then
      return gang_hand(mine, w)
    end
    redis.call('DEL', key('gangof', w))  -- its part is over: serve on
    if t[1] ~= 'leased' then redis.call('DEL', key('gang', mine)) end  -- the task ended: forget the gang
  end
  for _, tid in ipairs(redis.call('SMEMBERS', key('gangs'))) do
    local gk = key('gang', tid)
    local g = redis.call('HMGET', gk, 'phase', 'members', 'opened_ms', 'cap', 'class')
    local t = redis.call('HMGET', key('task', tid), 'render', 'capability')
    local render = t[1] or ''
    if g[1] ~= 'open' then
      redis.call('SREM', key('gangs'), tid)
    elseif NOW - (tonumber(g[3]) or 0) >= 3 * window then  -- its members stopped asking: back to the queue
      gang_dissolve(tid, gang_words(g[2]))
      if redis.call('HGET', key('task', tid), 'state') == 'queued' then push_ready(tid, true) end
    elseif #gang_words(g[2]) < tonumber(g[4]) and G.queues[t[2] or ''] and not blocklisted(render, w)
        and (g[5] == '*' or (g[5] or G.class) == G.class) and G.holds_needs(tid) then
      redis.call('HSET', gk, 'members', g[2] .. ' ' .. w)
      redis.call('SET', key('gangof', w), tid)
      if #gang_words(g[2]) + 1 >= tonumber(g[4]) then
        gang_start(G, tid)
        if redis.call('HGET', gk, 'phase') == 'started' then return gang_hand(tid, w) end
        redis.call('DEL', key('gangof', w))
        return nil
      end
      G.waiting()
      return false
    end
  end
  return nil
end

-- A gang member's heartbeat (not rank 0's, which holds the lease): the task's render while the gang it
-- is in still runs under that fence, else nil (stale: the member's rank ends at its next step).
local function gang_member_render(tid, w, fence)
  local t = redis.call('HMGET', key('task', tid), 'state', 'fence', 'render', 'gang_ended')
  if t[1] ~= 'leased' or t[2] ~= fence or t[4] == '1' then return nil end
  local g = redis.call('HMGET', key('gang', tid), 'members', 'phase', 'fence')
  if g[2] ~= 'started' or g[3] ~= fence or not has_word(g[1], w) then return nil end
  return t[3]
end
