-- The floor scripts/profile-redis-lua measures beside the store's code: the
-- least a function taking the store's requests can do for one-limit token
-- bucket checks. One MGET of the states, each decided inline (no other
-- algorithm, no shared keys, no multi-limit request), the admitted ones SET
-- with their TTL, every reply packed as the store's. Not the store's code and
-- not used by it: a measure of what the Lua interpreter and redis.call cost.
local function run(keys, args)
  local floor, max, min, ceil = math.floor, math.max, math.min, math.ceil
  local vals = redis.call('MGET', unpack(keys))
  local now = redis.call('TIME')
  now = tonumber(now[1]) * 1000000 + tonumber(now[2])
  local parts = {}
  for r = 3, #args do
    local blob = args[r]
    local _, _, pos = struct.unpack('<dd', blob)
    local _, _, _, burst, emission, cost = struct.unpack('<ddddddd', blob, pos)
    local key = keys[r - 2]
    local v = vals[r - 2]
    local last, tokens = 0, 9007199254740992
    if v then
      last, tokens = struct.unpack('<I7I5', v)
    end
    local capacity = burst * emission
    local n = max(now, last)
    tokens = min(tokens + (n - last), capacity)
    local need = cost * emission
    local a = 0
    if need <= tokens then
      tokens = tokens - need
      a = 1
      redis.call('SET', key, struct.pack('<I7I5', n, tokens), 'PX', string.format('%d', max(ceil((capacity - tokens) / 1000), 1)))
    end
    parts[#parts + 1] = struct.pack('<ddddddd', n, a, a, floor(tokens / emission), capacity - tokens, -1, 0)
  end
  return table.concat(parts)
end
