-- ARGV[3] render id. An operator lets the render's blocklisted workers lease its tasks again.
-- 1 when a live render had a blocklist (or failure counts) to clear, 0 otherwise.
local rid = ARGV[3]
if not render_active(rid) then return 0 end
local had = (redis.call('HGET', key('render', rid), 'blocklist') or '') ~= ''
  or redis.call('EXISTS', key('render', rid, 'wfail')) == 1
if not had then return 0 end
clear_blocklist(rid)
return 1
