-- ARGV[3] sha256, ARGV[4] created before this (ms). Forget an unreferenced blob's record, once it is
-- older than the cutoff (a blob uploaded since the caller's scan is kept). Returns its path, or false.
local bk = key('blob', ARGV[3])
local created = tonumber(redis.call('HGET', bk, 'created_ms') or '0')
if created >= tonumber(ARGV[4]) then return false end
local path = redis.call('HGET', bk, 'path')
redis.call('DEL', bk)
return path or false
