-- ARGV[3] task, ARGV[4] worker, ARGV[5] fence, ARGV[6] lease ms, ARGV[7] progress JSON or ''.
-- A beat is the worker's liveness too: busy while it holds the lease, idle once not (common.lua worker_seen).
-- Returns {status, '1' when the worker is asked to drain}: the whole beat in one round trip.
local tid, worker = ARGV[3], ARGV[4]
local drain = redis.call('HGET', key('worker', worker), 'drain') == '1' and '1' or '0'
local function beat(status)
  worker_seen(worker, status == 'ok' and 'busy' or 'idle', tid)
  return {status, drain}
end
local render = holder_render(tid, worker, ARGV[5])
if not render and gang_member_render(tid, worker, ARGV[5]) then return beat('ok') end  -- a rank > 0
if not render then return beat('stale') end
if not render_active(render) then return beat('cancel') end
local deadline = NOW + tonumber(ARGV[6])
redis.call('ZADD', key('leases'), deadline, tid)
redis.call('HSET', key('task', tid), 'deadline_ms', deadline)
if ARGV[7] ~= '' then
  redis.call('HSET', key('task', tid), 'progress', ARGV[7])
  local p = cjson.decode(ARGV[7])
  if type(p.resume) == 'table' then redis.call('HSET', key('task', tid), 'resume', cjson.encode(p.resume)) end
  if p.gang_ended then redis.call('HSET', key('task', tid), 'gang_ended', '1') end  -- its members go stale
  emit(render, {type = 'task_progress', task = tid, worker = worker, progress = cjson.decode(ARGV[7])})
end
return beat('ok')
