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
-- in `return run(KEYS, ARGV)`: see code.rs. Arguments and replies are
-- described at `run`, at the end.

-- Algorithm codes, as `Algorithm::index` in tollgate-core numbers them (a
-- unit test in code.rs holds the two together).
local TOKEN_BUCKET = 0
local GCRA = 1
local LEAKY = 2
local SHAPING = 3
local FIXED_WINDOW = 4
local SLIDING_LOG = 5
local SLIDING_COUNTER = 6
local CONCURRENCY = 7
local HIT_COUNTER = 8

local END = 9007199254740992 -- 2^53 us: the end of time on this side
local B = 16777216 -- 2^24, the limb base
-- Set by the first `run`: a function library's top level runs where only
-- `redis` is defined, so Lua's libraries are reached at call time, once, as
-- upvalues (which outlive a call): a global's lookup costs a check about
-- 185 instructions.
local floor, max, min, ceil
local struct_pack, struct_unpack, format
-- A call to one of those C functions costs a check in Redis about 360
-- instructions, a Lua function call 270, an operator a few dozen (callgrind
-- on redis-server, docs/benchmarks.md). So the code every check of a bucket
-- algorithm runs (`meter`, its `step`s, writing a string state, the reply)
-- uses operators: `x - x % 1` is floor(x) for every finite x, comparisons
-- pick a min or max, and it calls no helper it can do without.

-- Integers print exactly with %d (a C long: 64 bits on every Redis platform),
-- and faster than with %.0f.
local function fmt(x)
  return format('%d', x)
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
  local t, burst = q.emission, q.burst
  local capacity = burst * t
  local top = END - now
  if capacity < top then
    top = capacity
  end
  local need = cost * t
  local room = capacity - need
  -- A cost above the burst, or past the end of time, never fits.
  local fits = cost <= burst and used + need <= END - now
  if fits and used <= room then
    local after = used + need
    local newused = nil
    if cost > 0 then
      newused = after
    end
    local left = (top - after) / t
    return newused, 1, left - left % 1, after, -1, 0
  end
  local retry = -1
  if fits then
    retry = used - room
  end
  local left = top - used
  if left < 0 then
    left = 0
  end
  left = left / t
  return nil, 0, left - left % 1, used, retry, 0
end

-- String states are as small as Redis holds them, since every key of a
-- limit costs memory for as long as it lives:
-- - GCRA's and shaping's one time, and a fixed window's or hit counter's
--   count (one key per window), are decimal integers, which Redis keeps in
--   the value's pointer (no allocation at all);
-- - a time and an amount (token bucket, leaky bucket) are 12 bytes, the time in 7 and the amount in 5, while the
--   amount is below 2^40 (else two doubles, 16 bytes): Redis allocates a
--   12-byte value with its object in 32 bytes, a 16-byte one in 48;
-- - the sliding counter's three numbers are three doubles.
-- Binary, not text: `struct` is several times cheaper in Redis's Lua than
-- parsing and formatting decimals, and exact for every integer below 2^53.
local function parse_int(v)
  return tonumber(v) or 0
end

local COMPACT = 1099511627776 -- 2^40: the amounts a 12-byte state holds

-- A (time, amount) state, or the defaults when there is none.
local function parse_pair(v, time, amount)
  if not v then
    return time, amount
  end
  local t, a
  if #v == 12 then
    t, a = struct_unpack('<I7I5', v)
  else
    t, a = struct_unpack('<dd', v)
  end
  return t, a
end

local function pack_pair(time, amount)
  if amount < COMPACT then
    return struct_pack('<I7I5', time, amount)
  end
  return struct_pack('<dd', time, amount)
end

local function parse3(v)
  if not v then
    return 0, 0, 0
  end
  local a, b, c = struct_unpack('<ddd', v)
  return a, b, c
end

-- What the request being checked has done so far, so that two limits of
-- one request on the same key see each other's tentative admission, exactly
-- as in the memory store:
-- - `staged`: a string state's new value, the string that will be SET;
-- - `states`: a sorted set's state (sliding log, concurrency), as a table;
-- - `ttls`: the TTL (us) each of them is to be written with;
-- - `order`: the keys staged or in `states`, in the order first touched,
--   walked by index, since `pairs` calls C for every key.
-- A string state is decided from its value and staged as a value, never
-- held in a table: a table per limit cost a check more than its arithmetic
-- (docs/benchmarks.md). All are emptied after each request (a call that
-- failed half-way leaves some, which the next call drops).
local staged, states, ttls, order = {}, {}, {}, {}
-- Committed string states of this call (key -> value, false when absent):
-- a batch prefetches them with one MGET and keeps them up to date as its
-- requests write, so a key read twice in a call costs one lookup.
local committed = {}

-- The call's keys, its TTL padding and Redis's time (read at most once per
-- call): set by `run` on every call, since a function library's upvalues
-- outlive a call.
local keys, extra, redis_now

-- The value a string state is decided from: what this request staged for
-- it, else what is committed (read now when the call did not prefetch it);
-- nil when there is none.
local function value_of(key)
  local v = staged[key]
  if v then
    return v
  end
  v = committed[key]
  if v == nil then
    v = redis.call('GET', key)
    committed[key] = v
  end
  return v or nil
end

-- Stages `v` as the new value of the string state `key`, written when the
-- request is admitted; with `ttl`, the TTL (us) it is to be written with
-- (else the one its limit's step returns).
local function stage(key, v, ttl)
  if not staged[key] then
    order[#order + 1] = key
  end
  staged[key] = v
  if ttl then
    ttls[key] = ttl
  end
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
  order[#order + 1] = key
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
  order[#order + 1] = key
  return s
end

local function until_window_end(t, p, ahead)
  return p - t % p + p * ahead
end

-- A fixed window's or hit counter's key for the window holding `t`: its
-- limit's key, ':' and the window's number (`t` // `p`, exact: `t % p` is).
-- Must name it as native.rs does.
local function window_key(key, t, p)
  return key .. ':' .. fmt((t - t % p) / p)
end

-- Steps one limit. `write` says whether its admission is to be kept (false
-- once another limit of the request has denied: a peek, as in the memory
-- store). Returns the TTL (us) to set when it wrote (else nil), then the
-- decision.
local function step(alg, q, key, aux, now, cost, write, lease, index)
  if alg == TOKEN_BUCKET then
    -- (last refill, tokens); a new bucket is full: tokens clamp to the
    -- capacity at the first refill.
    local last, held = parse_pair(value_of(key), 0, END)
    local capacity = q.burst * q.emission
    local n = last
    if now > n then
      n = now
    end
    local tokens = held + (n - last)
    if tokens > capacity then
      tokens = capacity
    end
    local used, a, r, reset, retry, delay = meter(q, n, capacity - tokens, cost)
    if used and write then
      stage(key, pack_pair(n, capacity - used))
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == GCRA or alg == SHAPING then
    -- The theoretical arrival time, a decimal integer.
    local wait = parse_int(value_of(key)) - now
    if wait < 0 then
      wait = 0
    end
    local used, a, r, reset, retry, delay = meter(q, now, wait, cost)
    if a == 1 and alg == SHAPING then
      delay = max(wait - min(q.delay_after, q.burst) * q.emission, 0)
    end
    if used and write then
      stage(key, fmt(now + used))
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == LEAKY then
    -- (last leak, level).
    local last, held = parse_pair(value_of(key), 0, 0)
    local n = last
    if now > n then
      n = now
    end
    local level = held - (n - last)
    if level < 0 then
      level = 0
    end
    local used, a, r, reset, retry, delay = meter(q, n, level, cost)
    if used and write then
      stage(key, pack_pair(n, used))
      return reset, a, r, reset, retry, delay
    end
    return nil, a, r, reset, retry, delay
  elseif alg == FIXED_WINDOW or alg == HIT_COUNTER then
    -- The window's count, a decimal integer at `<key>:<window>` that the
    -- store's native INCRBY path shares (native.rs): a request counts in its
    -- own time's window.
    local p, l = q.period, q.limit
    local wkey = window_key(key, now, p)
    -- Never below zero: a native compensation that found its window gone
    -- leaves a negative count for a millisecond.
    local count = max(parse_int(value_of(wkey)), 0)
    local until_end = until_window_end(now, p, 0)
    if count + cost <= l then
      local after = count + cost
      local reset_after = 0
      if after > 0 then
        reset_after = until_end
      end
      if cost > 0 and write then
        stage(wkey, fmt(after), reset_after)
      end
      return nil, decision(true, l - after, reset_after)
    end
    local retry = nil
    if cost <= l and now + until_end <= END then
      retry = until_end
    end
    if alg == HIT_COUNTER and cost > 0 and write then
      -- The hit counter counts what it denies, kept one past the limit.
      stage(wkey, fmt(min(count + cost, l + 1)), until_end)
      return nil, decision(false, max(l - count, 0), until_end, retry)
    end
    local reset_after = 0
    if count > 0 then
      reset_after = until_end
    end
    return nil, decision(false, max(l - count, 0), reset_after, retry)
  elseif alg == SLIDING_COUNTER then
    -- (last admission, the count of the window before its, its window's).
    local last, before, current = parse3(value_of(key))
    local p, l = q.period, q.limit
    local n = max(now, last)
    local prev, cur = 0, 0
    local ahead = floor(n / p) - floor(last / p)
    if ahead == 0 then
      prev, cur = before, current
    elseif ahead == 1 then
      prev, cur = current, 0
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
        stage(key, struct_pack('<ddd', n, prev, after))
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
  elseif alg == SLIDING_LOG then
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
  elseif alg == CONCURRENCY then
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

-- A TTL of `ttl_us` as PX and PEXPIRE take it: whole milliseconds, rounded
-- up, at least 1, plus the call's padding.
local function ttl_ms(ttl_us)
  local ms = ttl_us / 1000
  ms = ms + (-ms) % 1
  if ms < 1 then
    ms = 1
  end
  return ms + extra
end

local function expire(key, ttl_us)
  redis.call('PEXPIRE', key, fmt(ttl_ms(ttl_us)))
end

local function expire_at_least(key, ttl_us)
  local ms = ttl_ms(ttl_us)
  if redis.call('PTTL', key) < ms then
    redis.call('PEXPIRE', key, fmt(ms))
  end
end

-- Writes the staged value `v` of the string state `key`.
local function write_value(key, v, ttl)
  redis.call('SET', key, v, 'PX', fmt(ttl_ms(ttl)))
  committed[key] = v
end

-- Writes the state `s` of the sorted set `key`.
local function write(key, s, ttl, now)
  if s.kind == 'log' then
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
    expire(key, ttl)
    expire(s.aux, ttl)
  elseif s.kind == 'lease' then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))
    for _, a in ipairs(s.added) do
      redis.call('ZADD', key, fmt(a[2]), a[1])
    end
    redis.call('SET', s.aux, fmt(s.count))
    expire_at_least(key, ttl)
    expire_at_least(s.aux, ttl)
  end
end

-- A request's time: its own, or (when negative) Redis's TIME.
local function time_of(t)
  if t >= 0 then
    return t
  end
  if not redis_now then
    local now = redis.call('TIME')
    redis_now = tonumber(now[1]) * 1000000 + tonumber(now[2])
  end
  return redis_now
end

-- A request is one argument of little-endian doubles: its time (-1: Redis's
-- TIME) and its number of limits, then seven per limit (algorithm, limit,
-- period, burst, emission, cost, delay_after); then, as text, the base of the
-- lease ids its concurrency limits add. Its keys are one per limit, two for a
-- sliding log or a concurrency limit (state, aux), in order from keys[k + 1].
local HEAD, LIMIT = 16, 56
local Q = {}

-- Whether an algorithm keeps an aux key beside its state.
local function has_aux(alg)
  return alg == SLIDING_LOG or alg == CONCURRENCY
end

-- Replies are the numbers packed as little-endian doubles: one string per
-- request, concatenated. The format of n doubles is made once per library.
local formats = {}
local function packed(out, from, to)
  local n = to - from + 1
  local f = formats[n]
  if not f then
    f = '<' .. string.rep('d', n)
    formats[n] = f
  end
  return struct_pack(f, unpack(out, from, to))
end

-- The numbers of the request being checked; reused, as only its first
-- `o` entries are packed.
local nums = {}

-- Checks one request (its argument `blob`, its keys after keys[k]); writes
-- only when every limit admits and `commit`. Returns its reply, {t,
-- all_allowed, 5 per limit} packed, and the index of its last key.
local function check_request(blob, k, commit)
  local t, count, pos = struct_unpack('<dd', blob)
  t = time_of(t)
  nums[1] = t
  nums[2] = 1
  local o = 2
  local all = true
  for i = 1, count do
    local alg, cost
    alg, Q.limit, Q.period, Q.burst, Q.emission, cost, Q.delay_after, pos = struct_unpack('<ddddddd', blob, pos)
    local key, aux = keys[k + 1], nil
    k = k + 1
    local lease = nil
    if has_aux(alg) then
      k = k + 1
      aux = keys[k]
      if alg == CONCURRENCY then
        lease = string.sub(blob, HEAD + LIMIT * count + 1)
      end
    end
    local ttl, a, r, reset, retry, delay = step(alg, Q, key, aux, t, cost, all and commit, lease, i)
    if a == 0 then
      all = false
    end
    if ttl then
      ttls[key] = ttl
    end
    nums[o + 1], nums[o + 2], nums[o + 3], nums[o + 4], nums[o + 5] = a, r, reset, retry, delay
    o = o + 5
  end
  -- A hit counter (sent as one only when it is its request's one limit)
  -- writes what it denies too; no other limit's deny is dirty.
  local keep = commit and (all or count == 1)
  for i = 1, #order do
    local key = order[i]
    if keep then
      local v = staged[key]
      if v then
        write_value(key, v, ttls[key])
      elseif states[key].dirty then
        write(key, states[key], ttls[key], t)
      end
    end
    staged[key], states[key], ttls[key], order[i] = nil, nil, nil, nil
  end
  if not all then
    nums[2] = 0
  end
  if o == 7 then
    -- One limit, the commonest request: packed without `unpack`.
    return struct_pack('<ddddddd', nums[1], nums[2], nums[3], nums[4], nums[5], nums[6], nums[7]), k
  end
  return packed(nums, 1, o), k
end

-- Loads every string state of the call's requests (args[from..to]) before
-- any is checked. On one slot, every key with one MGET (in chunks): a sorted
-- set's (a sliding log's, a concurrency limit's) reads as absent there and
-- is never looked up in `committed`, so the keys need not be told apart.
-- Across the slots of a cluster node (`cross`), each command must stay
-- within a slot, so each key is read on its own, and a key this node does
-- not serve (the client's slot map was stale) ends the call before anything
-- is written: returns that error, else nil.
local function prefetch(args, from, to, cross)
  if not cross then
    for first = 1, #keys, 500 do
      local last = min(first + 499, #keys)
      local values = redis.call('MGET', unpack(keys, first, last))
      for i = first, last do
        committed[keys[i]] = values[i - first + 1]
      end
    end
    return nil
  end
  local seen, k = {}, 0
  for r = from, to do
    local blob = args[r]
    for i = 1, struct_unpack('<d', blob, 9) do
      local alg = struct_unpack('<d', blob, HEAD + LIMIT * (i - 1) + 1)
      k = k + 1
      local key = keys[k]
      if has_aux(alg) then
        k = k + 1
        local probe = redis.pcall('EXISTS', key)
        if type(probe) == 'table' and probe.err then
          return probe.err
        end
      elseif not seen[key] then
        seen[key] = true
        local v = redis.pcall('GET', key)
        if type(v) == 'table' and v.err then
          return v.err
        end
        committed[key] = v
      end
    end
  end
  return nil
end

-- Gives `cost` units back to the string state `key` of a limit whose state
-- is one string (every algorithm but the sliding log and concurrency), as
-- taken by a check at `at`: a bucket's up to its capacity, a fixed window's
-- count only in the window of `at`. Never touches a TTL.
local function give(alg, q, key, cost, at)
  if alg == FIXED_WINDOW or alg == HIT_COUNTER then
    -- The count of the window the units were taken in, if it lives.
    local wkey = window_key(key, at, q.period)
    local c = tonumber(redis.call('GET', wkey) or nil)
    if c then
      redis.call('SET', wkey, fmt(max(c - cost, 0)), 'KEEPTTL')
    end
    return
  end
  local v = redis.call('GET', key) or nil
  if not v then
    return
  end
  if alg == TOKEN_BUCKET then
    local last, tokens = parse_pair(v, 0, 0)
    local capacity = q.burst * q.emission
    tokens = min(tokens + cost * q.emission, capacity)
    redis.call('SET', key, pack_pair(last, tokens), 'KEEPTTL')
  elseif alg == GCRA or alg == SHAPING then
    redis.call('SET', key, fmt(max(parse_int(v) - cost * q.emission, 0)), 'KEEPTTL')
  elseif alg == LEAKY then
    local last, level = parse_pair(v, 0, 0)
    redis.call('SET', key, pack_pair(last, max(level - cost * q.emission, 0)), 'KEEPTTL')
  elseif alg == SLIDING_COUNTER then
    local last, prev, cur = parse3(v)
    local ahead = floor(last / q.period) - floor(at / q.period)
    if ahead == 0 then
      cur = max(cur - cost, 0)
    elseif ahead == 1 then
      prev = max(prev - cost, 0)
    end
    redis.call('SET', key, struct_pack('<ddd', last, prev, cur), 'KEEPTTL')
  end
end

-- Hybrid leases' records (docs/redis.md, "Hybrid mode"): a hash at the
-- limit's auxiliary key, one field per holder (an instance, by the record
-- id it leases under), valued three doubles: the units it holds (the sum of what checks
-- leased to it, less what it said it no longer holds), the deadline (us)
-- past which any leasing check credits them back (the holder crashed, or
-- never saw the answer of a call that leased them), and the time (us) of
-- its latest lease (a fixed window's units belong to its window).
-- Takes `released` units off `holder`'s record and adds `leased`; a record
-- left empty goes, and one that is gone (credited back) is not made again
-- by a change that leases nothing. With a `ttl`, the record lasts that long
-- from `now`; without, its deadline stays. Says whether the record lived.
local function change(rkey, holder, released, leased, now, ttl, keep)
  local cur = redis.call('HGET', rkey, holder)
  if not cur and leased == 0 then
    return false
  end
  local units, deadline, at = 0, 0, now
  if cur then
    units, deadline, at = struct_unpack('<ddd', cur)
  end
  units = max(units - released, 0) + leased
  if units <= 0 then
    redis.call('HDEL', rkey, holder)
  else
    if ttl then
      deadline = now + ttl
      if leased > 0 then
        at = now
      end
    end
    redis.call('HSET', rkey, holder, struct_pack('<ddd', units, deadline, at))
    if ttl then
      -- After the write: a record's hash made by it gets its TTL too.
      expire_at_least(rkey, ttl + keep)
    end
  end
  return cur ~= false
end

-- Credits back the units of every record of `rkey` past its deadline at
-- `now`, and forgets those records.
local function credit_expired(alg, q, key, rkey, now)
  local rec = redis.call('HGETALL', rkey)
  for i = 1, #rec, 2 do
    local units, deadline, at = struct_unpack('<ddd', rec[i + 1])
    if deadline <= now then
      give(alg, q, key, units, at)
      redis.call('HDEL', rkey, rec[i])
    end
  end
end

-- A request's leases (`blob`, see `run`), decoded against the request
-- `req`: its holder, the records' ttl, and one entry per limit with a record
-- (its index, algorithm, quota, key, record key, units released and leased).
-- The record keys follow the request's keys.
local function leases_of(req, blob)
  local holder, ttl, lpos = struct_unpack('<dd', blob)
  local _, count, pos = struct_unpack('<dd', req)
  local k, out = 0, {}
  for i = 1, count do
    local alg, l, p, b, e, cost, d
    alg, l, p, b, e, cost, d, pos = struct_unpack('<ddddddd', req, pos)
    local released, leased
    released, leased, lpos = struct_unpack('<dd', blob, lpos)
    k = k + 1
    local key = keys[k]
    if has_aux(alg) then
      k = k + 1
    end
    if leased >= 0 then
      out[#out + 1] = { i = i, alg = alg, q = { limit = l, period = p, burst = b, emission = e },
        cost = cost, key = key, released = released, leased = leased }
    end
  end
  for j = 1, #out do
    out[j].rkey = keys[k + j]
  end
  return fmt(holder), ttl, out
end

-- How long a record outlives its deadline: as long as the state it credits
-- can still hold the units (a bucket's time to refill, a window's period).
local function keep_of(alg, q)
  if alg == FIXED_WINDOW or alg == HIT_COUNTER then
    return q.period
  end
  return q.burst * q.emission
end

-- Gives back what a committed check of the request `blob` (its time is the
-- check's) took: a later group of a cross-slot request denied, or a hybrid
-- instance's unspent leased units. With `leases`, a limit with a record
-- gives only while its holder's record lives (no later check credited it),
-- and takes its units `leased` off the record (undoing a lease; a give back
-- sends what it releases there), its deadline left as it is. What a
-- check's holder released stays released. Never touches a state's TTL.
local function refund(blob, leases)
  local now, count, pos = struct_unpack('<dd', blob)
  local holder, recs = nil, {}
  if leases then
    local _, list
    holder, _, list = leases_of(blob, leases)
    for _, r in ipairs(list) do
      recs[r.i] = r
    end
  end
  local k = 0
  for i = 1, count do
    local alg, cost
    alg, Q.limit, Q.period, Q.burst, Q.emission, cost, Q.delay_after, pos = struct_unpack('<ddddddd', blob, pos)
    local q = Q
    k = k + 1
    local key, aux = keys[k], nil
    if has_aux(alg) then
      k = k + 1
      aux = keys[k]
    end
    local r = recs[i]
    local live = true
    if r then
      live = change(r.rkey, holder, r.leased, 0, now)
    end
    if not live then
      -- Credited already: the units are back.
    elseif not aux then
      give(alg, q, key, cost, now)
    elseif alg == SLIDING_LOG then
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
    elseif alg == CONCURRENCY then
      local member = fmt(cost) .. '|' .. string.sub(blob, HEAD + LIMIT * count + 1) .. '_' .. i
      if redis.call('ZREM', key, member) == 1 then
        local c = tonumber(redis.call('GET', aux) or '0')
        redis.call('SET', aux, fmt(max(c - cost, 0)), 'KEEPTTL')
      end
    end
  end
  return { now }
end

-- Checks the request `blob` for a hybrid instance that leases part of its
-- limits' costs (`leases`, see `run`): first credits back every expired
-- record of those limits, then checks, then changes the holder's records:
-- what it released goes whatever the check decides, what it leases is
-- added when admitted. Changes add up, so a call whose answer the holder
-- never saw still counts in its record, and comes back with it.
local function check_leasing(blob, leases)
  local holder, ttl, list = leases_of(blob, leases)
  local now = time_of((struct_unpack('<d', blob)))
  for _, r in ipairs(list) do
    credit_expired(r.alg, r.q, r.key, r.rkey, now)
  end
  local reply = check_request(blob, 0, true)
  local admitted = struct_unpack('<d', reply, 9) == 1
  for _, r in ipairs(list) do
    change(r.rkey, holder, r.released, admitted and r.leased or 0, now, ttl, keep_of(r.alg, r.q))
  end
  return reply
end

-- The entry point: `run(KEYS, ARGV)`, as a script's last line or a
-- function's callback (see code.rs).
-- ARGV[1]  op: "c" check each request (write when every limit of it admits),
--              "x" the same for requests on several slots of one cluster
--              node, "d" dry run (never write), "r" refund one committed
--              request, "h" check one request leasing units to a hybrid
--              instance, "l" release leases
-- ARGV[2]  extra TTL in milliseconds added to every TTL
-- then, for "c", "d" and "r", one argument per request (see above); for "x",
-- the number of requests, one argument per request and every key but the
-- first (which is KEYS[1]); for "l", one per lease: its member
-- "<cost>|<id>", its keys the lease set and aux. "h" (and optionally "r")
-- take a second argument, the request's leases as little-endian doubles:
-- the holder's id (below 2^52), the records' ttl (us), then per limit the
-- units the holder released and those the call leases (-1: no record); its
-- keys are the request's, then each record's key (the limit's aux key), in
-- the order of the limits that have one.
-- Reply for "c"/"d": {t, all_allowed, then per limit: allowed, remaining,
-- reset_after, retry_after (-1: never), delay} for each request in turn,
-- packed as little-endian doubles in one string, and for "h" the same for
-- its one request. For "r": {t}; for "l": {}.
local function run(call_keys, args)
  keys, redis_now = call_keys, nil
  if not format then
    floor, max, min, ceil = math.floor, math.max, math.min, math.ceil
    struct_pack, struct_unpack, format = struct.pack, struct.unpack, string.format
  end
  committed = {}
  if #order > 0 then
    -- A call that failed half-way left its request's states.
    staged, states, ttls, order = {}, {}, {}, {}
  end
  local op = args[1]
  extra = tonumber(args[2])
  if op == 'c' or op == 'd' or op == 'x' then
    local from, to = 3, #args
    if op == 'x' then
      -- Requests of several slots of this cluster node: only KEYS[1] is
      -- declared (Redis routes by it); the other keys follow the requests.
      to = 3 + tonumber(args[3])
      from = 4
      local all = { keys[1] }
      for i = to + 1, #args do
        all[#all + 1] = args[i]
      end
      keys = all
      local err = prefetch(args, from, to, true)
      if err then
        return redis.error_reply('TOLLGATE_NOT_LOCAL ' .. err)
      end
    elseif to > from then
      prefetch(args, from, to, false)
    end
    if to == from then
      -- One request, the commonest call where callers are few: its reply
      -- without a table to join.
      return (check_request(args[from], 0, op ~= 'd'))
    end
    local parts, k = {}, 0
    for r = from, to do
      parts[r - from + 1], k = check_request(args[r], k, op ~= 'd')
    end
    return table.concat(parts)
  elseif op == 'r' then
    return refund(args[3], args[4])
  elseif op == 'h' then
    return check_leasing(args[3], args[4])
  elseif op == 'l' then
    for i = 3, #args do
      local key, aux = keys[2 * i - 5], keys[2 * i - 4]
      local member = args[i]
      if redis.call('ZREM', key, member) == 1 then
        local count = tonumber(redis.call('GET', aux) or '0')
        redis.call('SET', aux, fmt(max(count - cost_of(member), 0)), 'KEEPTTL')
      end
    end
    return {}
  end
  return redis.error_reply('unknown op ' .. tostring(op))
end
