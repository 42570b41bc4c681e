-- A worker's result and its next lease (CompleteRequest.next) in one round trip: complete.lua, then
-- lease.lua, each run as a local function of its own ARGV (store.py wraps them; NOW is one for both).
-- ARGV[3] = how many arguments after it are complete.lua's; the rest are lease.lua's.
-- Returns {complete.lua's status, lease.lua's reply or false}.
local n = tonumber(ARGV[3])
local function args(from, to)
  local a = {ARGV[1], ARGV[2]}
  for i = from, to do a[#a + 1] = ARGV[i] end
  return a
end
local status = complete(args(4, 3 + n))
return {status, lease(args(4 + n, #ARGV)) or false}
