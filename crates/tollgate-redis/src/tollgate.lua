-- Tollgate's Lua code: every algorithm of tollgate-core, stepped atomically
-- for all the limits of one request (one hash slot), all-or-nothing (a hit
-- counter checked alone also counts what it denies).
--
-- Units: time in MICROSECONDS (Redis Lua numbers are doubles, exact only up to
-- 2^53; nanoseconds since 1970 are ~1.8e18 and do not fit, microseconds are
-- ~1.8e15 and do until the year 2255). Counts (limit, burst, cost) are at most
-- 2^52, times and durations below 2^53: the Rust side validates this, so every
-- sum and comparison below is exact. Products of a count and a duration (the
-- sliding counter's weighting) go through `mul` / `muldiv`, exact on limbs.
--
-- Loaded as a function library (its callback is `run`) or as a script ending
-- in `return run(KEYS, ARGV)`: see code.rs.
--
-- KEYS: two per limit, (state, aux). aux holds the running total of a sliding
-- log or the in-flight count of a concurrency limiter; other algorithms ignore it.
-- ARGV[1]  op: "c" check (write when every limit admits), "d" dry (never write),
--              "b" a batch of checks (see below), "r" refund a committed
--              check, "l" release leases
-- ARGV[2]  now in microseconds, or "" to read Redis's TIME
-- ARGV[3]  extra TTL in milliseconds added to every TTL
-- ARGV[4]  lease id base (concurrency members are "<cost>|<base>_<index>";
--          all after the cost is the lease id the store hands out)
-- then one argument per limit: seven little-endian doubles (algorithm, limit,
-- period, burst, emission, cost, delay_after), so nothing is parsed from text
-- (algorithm codes: 0 token bucket, 1 gcra, 2 leaky, 3 shaping, 4 fixed window,
--  5 sliding log, 6 sliding counter, 7 concurrency, 8 hit counter).
--
-- Reply for "c"/"d": {now, all_allowed, then per limit: allowed, remaining,
-- reset_after, retry_after (-1: never), delay}, packed as little-endian
-- doubles in one string; for "b", that for each request in turn. For "r"/"l":
-- {now} as an array.

local END = 9007199254740992 -- 2^53 us: the end of time on this side
local B = 16777216 -- 2^24, the limb base
-- Set by `run`: a function library's top level runs where only `redis` is
-- defined, so Lua's libraries are reached at call time.
local floor, max, min, ceil

-- Integers print exactly with %d (a C long: 64 bits on every Redis platform),
-- and faster than with %.0f.
local function fmt(x)
  return string.format('%d', x)
end

-- Three base-2^24 limbs of a < 2^53 (low first).
local function limbs(a)
  local a0 = a % B
  a = (a - a0) / B
  local a1 = a % B
  return a0, a1, (a - a1) / B
end

-- a * b exactly, as six base-2^24 limbs (low first). Each partial sum stays
-- below 3 * 2^48 before carrying: exact in doubles.
local function mul(a, b)
  local a0, a1, a2 = limbs(a)
  local b0, b1, b2 = limbs(b)
  local r = { a0 * b0, a0 * b1 + a1 * b0, a0 * b2 + a1 * b1 + a2 * b0, a1 * b2 + a2 * b1, a2 * b2, 0 }
  for i = 1, 5 do
    local c = floor(r[i] / B)
    r[i] = r[i] - c * B
    r[i + 1] = r[i + 1] + c
  end
  return r
end

local function cmp(x, y)
  for i = 6, 1, -1 do
    if x[i] ~= y[i] then
      return x[i] < y[i] and -1 or 1
    end
  end
  return 0
end

-- floor(a * b / d) and whether it was exact, for a, b, d < 2^53 and a result
-- below 2^53. The double estimate is off by a few units at most; exact limb
-- comparisons correct it.
local function muldiv(a, b, d)
  local target = mul(a, b)
  local q = floor(a * b / d)
  if q > END then
    q = END
  end
  for _ = 1, 64 do
    if q > 0 and cmp(mul(q, d), target) > 0 then
      q = q - 1
    else
      break
    end
  end
  for _ = 1, 64 do
    if cmp(mul(q + 1, d), target) <= 0 then
      q = q + 1
    else
      break
    end
  end
  return q, cmp(mul(q, d), target) == 0
end

local function muldiv_ceil(a, b, d)
  local q, exact = muldiv(a, b, d)
  if exact then
    return q
  end
  return q + 1
end

-- A decision as five numbers: allowed (1/0), remaining, reset_after,
-- retry_after (-1: never), delay. Returned as values, not a table: a table
-- per limit is a measurable share of a check's time in Redis.
local function decision(allowed, remaining, reset, retry, delay)
  return allowed and 1 or 0, remaining, reset, retry or -1, delay or 0
end

-- The mechanism shared by the token bucket, GCRA and both leaky buckets
-- (tollgate-core's meter.rs): `used` is how much of the capacity is taken, in
-- microseconds of draining. Returns, on an admission, the new `used` (nil
-- when nothing is to be written), then the decision.
local function meter(q, now, used, cost)
  local t = q.emission
  local capacity = q.burst * t
  local top = min(capacity, END - now)
  local need = cost * t
  if cost > q.burst or used + need > END - now then
    return nil, decision(false, floor(max(top - used, 0) / t), used, nil)
  end
  local room = capacity - need
  if used <= room then
    local after = used + need
    local newused = nil
    if cost > 0 then
      newused = after
    end
    return newused, decision(true, floor((top - after) / t), after, nil)
  end
  return nil, decision(false, floor(max(top - used, 0) / t), used, used - room)
end

-- String states are one, two or three little-endian doubles (struct.pack
-- '<d'): exact for every integer below 2^53, and several times cheaper to read
-- and write than decimal text.
local function parse1(v, d1)
  if not v then
    return d1
  end
  return (struct.unpack('<d', v))
end

local function parse2(v, d1, d2)
  if not v then
    return d1, d2
  end
  local a, b = struct.unpack('<dd', v)
  return a, b
end

local function parse3(v)
  if not v then
    return 0, 0, 0
  end
  local a, b, c = struct.unpack('<ddd', v)
  return a, b, c
end

local function pack(a, b, c)
  if c then
    return struct.pack('<ddd', a, b, c)
  elseif b then
    return struct.pack('<dd', a, b)
  end
  return struct.pack('<d', a)
end

-- State of every key touched by this call, loaded once: two limits of one
-- request on the same key see each other's tentative admission, exactly as in
-- the memory store.
local states = {}
-- Committed string states of this call (key -> value, false when absent):
-- a batch prefetches them with one MGET and keeps them up to date as its
-- requests write, so a key read twice in a call costs one lookup.
local committed = {}

local function load_simple(key, alg, q)
  local s = states[key]
  if s then
    return s
  end
  local v = committed[key]
  if v == nil then
    v = redis.call('GET', key)
    committed[key] = v
  end
  v = v or nil
  s = { kind = 'simple' }
  if alg == 0 then
    -- A new bucket is full: tokens clamp to the capacity at the first refill.
    s.a, s.b = parse2(v, END, 0)
  elseif alg == 1 or alg == 3 then
    s.a = parse1(v, 0)
  elseif alg == 2 or alg == 4 or alg == 8 then
    s.a, s.b = parse2(v, 0, 0)
  elseif alg == 6 then
    s.a, s.b, s.c = parse3(v)
  end
  states[key] = s
  return s
end

local function cost_of(member)
  return tonumber(string.match(member, '^(%d+)'))
end

-- Sliding log: a sorted set of "<time>:<cost>" members scored by time, plus
-- the total of their costs in aux. Entries leave on the next admission.
local function load_log(key, aux)
  local s = states[key]
  if s then
    return s
  end
  s = { kind = 'log', aux = aux, total = tonumber(redis.call('GET', aux) or '0'), drained = -1, pending = 0 }
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if newest[2] then
    s.newest = tonumber(newest[2])
    s.newest_member = newest[1]
  end
  states[key] = s
  return s
end

local function log_sum(key, upto)
  local sum = 0
  if upto >= 0 then
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '-inf', fmt(upto))) do
      sum = sum + tonumber(string.match(m, ':(%d+)$'))
    end
  end
  return sum
end

-- Concurrency: a sorted set of leases "<cost>|<id>" scored by their expiry,
-- plus the in-flight total in aux. A crashed holder's lease expires.
local function load_leases(key, aux, now)
  local s = states[key]
  if s then
    return s
  end
  s = { kind = 'lease', aux = aux, count = tonumber(redis.call('GET', aux) or '0'), added = {} }
  local expired = 0
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '-inf', fmt(now))) do
    expired = expired + cost_of(m)
  end
  s.count = max(s.count - expired, 0)
  s.expired = expired
  states[key] = s
  return s
end

local function until_window_end(t, p, ahead)
  return p - t % p + p * ahead
end

-- Steps one limit. `write` says whether its admission is to be kept (false
-- once another limit of the request has denied: a peek, as in the memory
-- store). Returns the TTL (us) to set when it wrote (else nil), then the
-- decision.
local function step(alg, q, key, aux, now, cost, write, lease, index)
  if alg == 0 then
    local s = load_simple(key, alg, q)
    local capacity = q.burst * q.emission
    local n = max(now, s.b)
    local tokens = min(s.a + (n - s.b), capacity)
    local used, a, r, reset, retry, delay = meter(q, n, capacity - tokens, cost)
    if used and write then
      s.a, s.b, s.dirty = capacity - used, n, true
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == 1 or alg == 3 then
    local s = load_simple(key, alg, q)
    local wait = max(s.a - now, 0)
    local used, a, r, reset, retry, delay = meter(q, now, wait, cost)
    if a == 1 and alg == 3 then
      delay = max(wait - min(q.delay_after, q.burst) * q.emission, 0)
    end
    if used and write then
      s.a, s.dirty = now + used, true
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == 2 then
    local s = load_simple(key, alg, q)
    local n = max(now, s.b)
    local used, a, r, reset, retry, delay = meter(q, n, max(s.a - (n - s.b), 0), cost)
    if used and write then
      s.a, s.b, s.dirty = used, n, true
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == 4 or alg == 8 then
    local s = load_simple(key, alg, q)
    local p, l = q.period, q.limit
    local n = max(now, s.a)
    local count = 0
    if floor(n / p) == floor(s.a / p) then
      count = s.b
    end
    local until_end = until_window_end(n, p, 0)
    local function reset(c)
      if c == 0 then
        return 0
      end
      return until_end
    end
    if count + cost <= l then
      local after = count + cost
      local reset_after = reset(after)
      if cost > 0 and write then
        s.a, s.b, s.dirty = n, after, true
        return reset_after, decision(true, l - after, reset_after)
      end
      return nil, decision(true, l - after, reset_after)
    end
    local retry = nil
    if cost <= l and n + until_end <= END then
      retry = until_end
    end
    if alg == 8 and cost > 0 and write then
      -- The hit counter counts what it denies, kept one past the limit.
      local seen = min(count + cost, l + 1)
      s.a, s.b, s.dirty = n, seen, true
      return reset(seen), decision(false, max(l - count, 0), reset(seen), retry)
    end
    return nil, decision(false, max(l - count, 0), reset(count), retry)
  elseif alg == 6 then
    local s = load_simple(key, alg, q)
    local p, l = q.period, q.limit
    local n = max(now, s.a)
    local prev, cur = 0, 0
    local ahead = floor(n / p) - floor(s.a / p)
    if ahead == 0 then
      prev, cur = s.b, s.c
    elseif ahead == 1 then
      prev, cur = s.c, 0
    end
    local e = n % p
    -- previous * (p - e) / p rounded up is prev - k: the weighted estimate.
    local k = muldiv(prev, e, p)
    local function remaining(c)
      return max(l - c - prev + k, 0)
    end
    local function reset(c)
      if prev == 0 and c == 0 then
        return 0
      elseif c == 0 then
        return until_window_end(n, p, 0)
      end
      return until_window_end(n, p, 1)
    end
    local after = cur + cost
    if after <= l and l - after - prev + k >= 0 then
      local reset_after = reset(after)
      if cost > 0 and write then
        s.a, s.b, s.c, s.dirty = n, prev, after, true
        return reset_after, decision(true, remaining(after), reset_after)
      end
      return nil, decision(true, remaining(after), reset_after)
    end
    -- First offset in a window, from `from`, at which the cost fits.
    local function first_fit(pv, c, from)
      if c + cost > l then
        return nil
      end
      local excess = pv + c + cost - l
      local at = 0
      if excess > 0 then
        at = muldiv_ceil(excess, p, pv)
      end
      at = max(at, from)
      if at < p then
        return at
      end
      return nil
    end
    local start = n - e
    local retry_at = nil
    if cost <= l then
      local at = first_fit(prev, cur, e)
      if at then
        retry_at = start + at
      else
        retry_at = start + p + (first_fit(cur, 0, 0) or p)
      end
      if retry_at > END then
        retry_at = nil
      end
    end
    local retry = nil
    if retry_at then
      retry = retry_at - n
    end
    return nil, decision(false, remaining(cur), reset(cur), retry)
  elseif alg == 5 then
    local s = load_log(key, aux)
    local p, l = q.period, q.limit
    local n = now
    if s.newest and s.newest > n then
      n = s.newest
    end
    local threshold = n - p
    -- Live total: what is stored, less what has left the window (or was
    -- drained by an earlier limit of this request), plus this request's own
    -- tentative admissions (at `now`, always live).
    local gone = log_sum(key, max(threshold, s.drained))
    local total = s.total - gone + s.pending
    local newest_live = nil
    if s.pending > 0 then
      newest_live = n
    elseif s.newest and n - s.newest < p and s.newest > s.drained then
      newest_live = s.newest
    end
    local function reset(t)
      if not t then
        return 0
      end
      return p - (n - t)
    end
    if total + cost <= l then
      local reset_after = reset(newest_live)
      if cost > 0 then
        reset_after = p
      end
      if cost > 0 and write then
        s.drained = max(s.drained, threshold)
        s.pending = s.pending + cost
        s.at = n
        s.dirty = true
        return p, decision(true, l - (total + cost), reset_after)
      end
      return nil, decision(true, l - (total + cost), reset_after)
    end
    local retry = nil
    if cost <= l then
      local live = {}
      for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. fmt(max(threshold, s.drained)), '+inf', 'WITHSCORES')) do
        live[#live + 1] = m
      end
      local left = total
      local i = 1
      while i <= #live do
        local t = tonumber(live[i + 1])
        local c = tonumber(string.match(live[i], ':(%d+)$'))
        if s.pending > 0 and t == n then
          c = c + s.pending
        end
        left = left - c
        if cost <= l - left then
          if t + p <= END then
            retry = t + p - n
          end
          break
        end
        i = i + 2
      end
      if i > #live and s.pending > 0 and (#live == 0 or tonumber(live[#live]) ~= n) then
        -- The request's own tentative entry is the last to leave.
        if n + p <= END then
          retry = p
        end
      end
    end
    return nil, decision(false, max(l - total, 0), reset(newest_live), retry)
  elseif alg == 7 then
    local s = load_leases(key, aux, now)
    local l = q.limit
    if s.count + cost <= l then
      local after = s.count + cost
      if cost > 0 and write then
        s.count, s.dirty = after, true
        s.added[#s.added + 1] = { fmt(cost) .. '|' .. lease .. '_' .. index, now + q.period }
        return q.period, decision(true, l - after, 0)
      end
      return nil, decision(true, l - after, 0)
    end
    return nil, decision(false, max(l - s.count, 0), 0, nil)
  end
  error('unknown algorithm ' .. tostring(alg))
end

local function expire(key, ttl_us, extra_ms)
  local ms = max(ceil(ttl_us / 1000), 1) + extra_ms
  redis.call('PEXPIRE', key, fmt(ms))
end

local function expire_at_least(key, ttl_us, extra_ms)
  local ms = max(ceil(ttl_us / 1000), 1) + extra_ms
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, fmt(ms))
  end
end

local function write(key, s, ttl, extra)
  if s.kind == 'simple' then
    local v = pack(s.a, s.b, s.c)
    redis.call('SET', key, v, 'PX', fmt(max(ceil(ttl / 1000), 1) + extra))
    committed[key] = v
  elseif s.kind == 'log' then
    local gone = log_sum(key, s.drained)
    if s.drained >= 0 then
      redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(s.drained))
    end
    local add = s.pending
    local member = redis.call('ZRANGEBYSCORE', key, fmt(s.at), fmt(s.at))
    if member[1] then
      add = add + tonumber(string.match(member[1], ':(%d+)$'))
      redis.call('ZREM', key, member[1])
    end
    redis.call('ZADD', key, fmt(s.at), fmt(s.at) .. ':' .. fmt(add))
    redis.call('SET', s.aux, fmt(s.total - gone + s.pending))
    expire(key, ttl, extra)
    expire(s.aux, ttl, extra)
  elseif s.kind == 'lease' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(s.now))
    for _, a in ipairs(s.added) do
      redis.call('ZADD', key, fmt(a[2]), a[1])
    end
    redis.call('SET', s.aux, fmt(s.count))
    expire_at_least(key, ttl, extra)
    expire_at_least(s.aux, ttl, extra)
  end
end

-- The call's keys and arguments, its TTL padding and Redis's time (read at
-- most once per call): set by `run` on every call, since a function library's
-- upvalues outlive a call.
local keys, args, extra, redis_now

-- A request's time: its own argument, or Redis's TIME.
local function time_of(arg)
  if arg ~= '' then
    return tonumber(arg)
  end
  if not redis_now then
    local t = redis.call('TIME')
    redis_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return redis_now
end

-- The i-th limit after args[at]: one argument of seven little-endian doubles
-- (algorithm, limit, period, burst, emission, cost, delay_after). Returns the
-- algorithm, the quota and the cost; the quota table is reused (no step keeps it).
local Q = {}
local function quota(at, i)
  local alg, limit, period, burst, emission, cost, delay_after = struct.unpack('<ddddddd', args[at + i])
  Q.limit, Q.period, Q.burst, Q.emission, Q.delay_after = limit, period, burst, emission, delay_after
  return alg, Q, cost
end

-- Replies are the numbers packed as little-endian doubles in one string.
local function packed(out)
  local parts = {}
  for i = 1, #out, 100 do
    local j = min(i + 99, #out)
    parts[#parts + 1] = struct.pack('<' .. string.rep('d', j - i + 1), unpack(out, i, j))
  end
  return table.concat(parts)
end

-- Checks one request of `count` limits (keys from keys[keys_at + 1], limit
-- arguments after args[args_at]) at `t`, appending {t, all_allowed, 5 per
-- limit} to `reply`; writes only when every limit admits and `commit`.
local function check_request(reply, keys_at, args_at, count, commit, t, lease)
  states = {}
  local o = #reply
  reply[o + 1] = t
  reply[o + 2] = 1
  local first = o + 2
  o = first
  local all = true
  for i = 1, count do
    local alg, q, cost = quota(args_at, i)
    local key, aux = keys[keys_at + 2 * i - 1], keys[keys_at + 2 * i]
    local ttl, a, r, reset, retry, delay = step(alg, q, key, aux, t, cost, all and commit, lease, i)
    if a == 0 then
      all = false
    end
    if ttl then
      states[key].ttl = ttl
    end
    reply[o + 1], reply[o + 2], reply[o + 3], reply[o + 4], reply[o + 5] = a, r, reset, retry, delay
    o = o + 5
  end
  -- A hit counter (sent as one only when it is its request's one limit)
  -- writes what it denies too; no other limit's deny is dirty.
  if commit and (all or count == 1) then
    for key, s in pairs(states) do
      if s.dirty then
        s.now = t
        write(key, s, s.ttl, extra)
      end
    end
  end
  if not all then
    reply[first] = 0
  end
end

-- The entry point: `run(KEYS, ARGV)`, as a script's last line or a function's
-- callback (see the module docs of script.rs).
local function run(call_keys, call_args)
  keys, args, redis_now = call_keys, call_args, nil
  floor, max, min, ceil = math.floor, math.max, math.min, math.ceil
  states, committed = {}, {}
  local op = args[1]
  local now = time_of(args[2])
  extra = tonumber(args[3])
  local lease_base = args[4]
  local n = #keys / 2
  if op == 'c' or op == 'd' then
    local reply = {}
    check_request(reply, 0, 4, n, op == 'c', now, lease_base)
    return packed(reply)
  elseif op == 'b' then
    -- A batch of independent requests, each all-or-nothing on its own:
    -- args[5] = number of requests, then per request: now, lease id base, its
    -- number of limits, and one argument per limit. KEYS hold every request's
    -- keys in order.
    local reply = {}
    -- Prefetch every string state of the batch in one MGET.
    local simple, seen = {}, {}
    local pos, keys_at = 6, 0
    for _ = 1, tonumber(args[5]) do
      local count = tonumber(args[pos + 2])
      for i = 1, count do
        local alg = struct.unpack('<d', args[pos + 2 + i])
        local key = keys[keys_at + 2 * i - 1]
        if alg ~= 5 and alg ~= 7 and not seen[key] then
          seen[key] = true
          simple[#simple + 1] = key
        end
      end
      keys_at = keys_at + 2 * count
      pos = pos + 3 + count
    end
    for from = 1, #simple, 500 do
      local upto = min(from + 499, #simple)
      local values = redis.call('MGET', unpack(simple, from, upto))
      for i = from, upto do
        committed[simple[i]] = values[i - from + 1]
      end
    end
    pos, keys_at = 6, 0
    for _ = 1, tonumber(args[5]) do
      local count = tonumber(args[pos + 2])
      check_request(reply, keys_at, pos + 2, count, true, time_of(args[pos]), args[pos + 1])
      keys_at = keys_at + 2 * count
      pos = pos + 3 + count
    end
    return packed(reply)
  elseif op == 'r' then
    -- Gives back what a committed check at `now` took (a later group of a
    -- cross-slot request denied). Never touches a TTL.
    for i = 1, n do
      local alg, q, cost = quota(4, i)
      local key, aux = keys[2 * i - 1], keys[2 * i]
      local v = nil
      if alg ~= 5 and alg ~= 7 then
        v = redis.call('GET', key) or nil
      end
      if alg == 0 and v then
        local tokens, last = parse2(v, 0, 0)
        local capacity = q.burst * q.emission
        tokens = min(tokens + cost * q.emission, capacity)
        redis.call('SET', key, pack(tokens, last), 'KEEPTTL')
      elseif (alg == 1 or alg == 3) and v then
        redis.call('SET', key, pack(max(parse1(v, 0) - cost * q.emission, 0)), 'KEEPTTL')
      elseif alg == 2 and v then
        local level, last = parse2(v, 0, 0)
        redis.call('SET', key, pack(max(level - cost * q.emission, 0), last), 'KEEPTTL')
      elseif (alg == 4 or alg == 8) and v then
        local last, count = parse2(v, 0, 0)
        if floor(last / q.period) == floor(now / q.period) then
          redis.call('SET', key, pack(last, max(count - cost, 0)), 'KEEPTTL')
        end
      elseif alg == 6 and v then
        local last, prev, cur = parse3(v)
        local ahead = floor(last / q.period) - floor(now / q.period)
        if ahead == 0 then
          cur = max(cur - cost, 0)
        elseif ahead == 1 then
          prev = max(prev - cost, 0)
        end
        redis.call('SET', key, pack(last, prev, cur), 'KEEPTTL')
      elseif alg == 5 then
        local member = redis.call('ZRANGEBYSCORE', key, fmt(now), fmt(now))
        if member[1] then
          local c = tonumber(string.match(member[1], ':(%d+)$'))
          redis.call('ZREM', key, member[1])
          local taken = min(c, cost)
          if c > taken then
            redis.call('ZADD', key, fmt(now), fmt(now) .. ':' .. fmt(c - taken))
          end
          local total = tonumber(redis.call('GET', aux) or '0')
          redis.call('SET', aux, fmt(max(total - taken, 0)), 'KEEPTTL')
        end
      elseif alg == 7 then
        local member = fmt(cost) .. '|' .. lease_base .. '_' .. i
        if redis.call('ZREM', key, member) == 1 then
          local count = tonumber(redis.call('GET', aux) or '0')
          redis.call('SET', aux, fmt(max(count - cost, 0)), 'KEEPTTL')
        end
      end
    end
    return { now }
  elseif op == 'l' then
    -- Releases leases: args[4 + i] is the i-th lease's full member.
    for i = 1, n do
      local key, aux = keys[2 * i - 1], keys[2 * i]
      local member = args[4 + i]
      if redis.call('ZREM', key, member) == 1 then
        local count = tonumber(redis.call('GET', aux) or '0')
        redis.call('SET', aux, fmt(max(count - cost_of(member), 0)), 'KEEPTTL')
      end
    end
    return { now }
  end
  return redis.error_reply('unknown op ' .. tostring(op))
end
