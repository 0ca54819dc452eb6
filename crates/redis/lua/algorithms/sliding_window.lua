-- The approximated sliding window (code 5): a port of
-- crates/core/src/algorithms/sliding_window.rs, with 2 counters (the
-- weighted previous window) or N (N - 1 sub-windows and the weighted
-- oldest). It cannot schedule: no acquire_wait, so acquire mode answers
-- cannot_schedule as the core does.
-- Parameters: p[1] limit, p[2] buckets (counters), p[3] sub-window (ns),
-- p[4] max_debt (how far past the limit a report may take the estimate).
-- Stored: v[3] the start of the sub-window counted by the first counter
-- (T.put), v[4..] the counters, newest first.
-- A fresh state's start is PAST where the core has Nanos::ZERO: both put
-- every counter out of sight (the shift is clamped to the bucket count),
-- and the first grant moves the start to now's sub-window either way.
-- Products such as oldest × (S − e) pass 2^53 for long windows and large
-- counts (10^9 over 30 days), so they only ever go through muldiv.
LOADERS[5] = function()

  -- Rust's `view`: the start of the sub-window holding `now`, how much of
  -- it has elapsed and how many sub-windows the counters are shifted by.
  local function sw_view(p, st, now)
    local s = p[3]
    -- T.mod is the core's `now % s` on the absolute time: sub-windows are
    -- aligned to the Unix epoch, not to the script's now.
    local start = now - T.mod(now, s)
    if start < st.start then
      -- Time went backwards: the core keeps the counters and weighs the
      -- oldest fully.
      return st.start, 0, 0
    end
    -- From PAST the difference is inexact but far above p[2] × s (< 2^53),
    -- so the clamp gives p[2] as the core's does.
    local shift = min(floor((start - st.start) / s), p[2])
    return start, now - start, shift
  end

  -- The counter at `index` (0 = current) once shifted by `shift`; a
  -- missing one (state stored under another bucket count) is 0.
  local function sw_count_at(st, shift, index)
    if index < shift then return 0 end
    return st.counts[index - shift + 1] or 0
  end

  -- (sum of the whole sub-windows incl. the current one, the oldest).
  -- No saturation needed: every counter is at most the limit (< 2^52),
  -- and grants keep whole <= limit, so the sums stay exact.
  local function sw_split(p, st, shift)
    local n = p[2]
    local whole = 0
    for i = 0, n - 2 do
      whole = whole + sw_count_at(st, shift, i)
    end
    return whole, sw_count_at(st, shift, n - 1)
  end

  -- `room_under`: room under any limit (limit + max_debt for a report).
  local function sw_room_under(p, limit, whole, oldest, elapsed)
    local s = p[3]
    local weighted = muldiv_ceil(oldest, s - elapsed, s)
    if weighted > limit then return 0 end
    return sat_sub(limit - weighted, whole)
  end

  -- Rust's `room_with` without its u128s: with w = oldest × (S − e),
  -- floor((limit·S − w) / S) = limit − ceil(w / S), and w > limit·S exactly
  -- when ceil(w / S) > limit (limit is an integer), so one muldiv_ceil
  -- (quotient <= oldest < 2^52) decides both.
  local function sw_room_with(p, whole, oldest, elapsed)
    return sw_room_under(p, p[1], whole, oldest, elapsed)
  end

  local function sw_retry_after(p, st, now, min_hits)
    local limit, n, s = p[1], p[2], p[3]
    if min_hits > limit then return false end
    local start, elapsed, shift = sw_view(p, st, now)
    -- Each step shifts the counters by one sub-window, as in the core.
    local whole, oldest = sw_split(p, st, shift)
    for k = 0, n do
      local from = 0
      if k == 0 then from = elapsed end
      if whole + min_hits <= limit then
        local r = limit - (whole + min_hits)
        local e_min = 0
        if oldest > 0 then
          -- The core's min(floor(r·S / oldest), S): when r >= oldest the
          -- quotient is at least S, so muldiv only runs with a quotient
          -- below S (< 2^52), where it is exact.
          local slack = s
          if r < oldest then slack = muldiv(r, s, oldest) end
          e_min = s - slack
        end
        local e = max(e_min, from)
        if e < s then
          return sat_sub(start + s * k + e, now)
        end
      end
      local moving = sw_count_at(st, shift + k, n - 2)
      whole = sat_sub(whole, moving)
      oldest = moving
    end
    -- Unreachable: after N shifts every counter is gone.
    return 0
  end

  local function sw_is_idle(p, st, now)
    local _, _, shift = sw_view(p, st, now)
    for i = 0, p[2] - 1 do
      if sw_count_at(st, shift, i) > 0 then return false end
    end
    return true
  end

  -- Moves the counters so that the first is now's sub-window: the core's
  -- resize to n, rotate_right(shift) and zeroing of the first `shift`
  -- counters, in one pass.
  local function sw_shift(p, st, now)
    local start, _, shift = sw_view(p, st, now)
    if shift > 0 then
      local n = p[2]
      local old, counts = st.counts, {}
      for i = 1, n do
        if i <= shift then
          counts[i] = 0
        else
          counts[i] = old[i - shift] or 0
        end
      end
      st.counts = counts
      st.start = start
    end
  end

  -- Counts `hits` in now's sub-window.
  local function sw_add(p, st, now, hits)
    sw_shift(p, st, now)
    if #st.counts > 0 then
      st.counts[1] = st.counts[1] + hits
    end
  end

  local function sw_describe(p, st, now, req, grant)
    local n, s = p[2], p[3]
    local start, elapsed, shift = sw_view(p, st, now)
    local whole, oldest = sw_split(p, st, shift)
    local reset_after = 0
    for i = 0, n - 1 do
      if sw_count_at(st, shift, i) > 0 then
        reset_after = sat_sub(start + s * (n - i), now)
        break
      end
    end
    return {
      granted = grant.granted,
      allowed = grant.allowed,
      limit = p[1],
      remaining = sw_room_with(p, whole, oldest, elapsed),
      reset_after = reset_after,
      retry_after = sw_retry_after(p, st, now, req.min_hits),
      wait = 0,
    }
  end

  ALG[5] = {
    name = 'sliding_window',
    fresh = function(p, now)
      local counts = {}
      for i = 1, p[2] do counts[i] = 0 end
      return { start = PAST, counts = counts }
    end,
    decode = function(p, v, base)
      local counts = {}
      for i = 4, #v do counts[#counts + 1] = v[i] end
      return { start = T.get(v[3], base), counts = counts }
    end,
    encode = function(p, st)
      local v = { T.put(st.start) }
      for i = 1, #st.counts do v[#v + 1] = st.counts[i] end
      return v
    end,
    room = function(p, st, now, hits)
      local _, elapsed, shift = sw_view(p, st, now)
      local whole, oldest = sw_split(p, st, shift)
      return min(sw_room_with(p, whole, oldest, elapsed), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then sw_add(p, st, now, grant.granted) end
      return sw_describe(p, st, now, req, grant)
    end,
    usage = function(p, st, now, hits, refund)
      local n = 0
      if refund then
        if not sw_is_idle(p, st, now) then
          sw_shift(p, st, now)
          local left = hits
          for i = 1, #st.counts do
            local back = min(left, st.counts[i])
            st.counts[i] = st.counts[i] - back
            left = left - back
          end
          n = hits - left
        end
      else
        local _, elapsed, shift = sw_view(p, st, now)
        local whole, oldest = sw_split(p, st, shift)
        n = min(sw_room_under(p, p[1] + p[4], whole, oldest, elapsed), hits)
        if n > 0 then sw_add(p, st, now, n) end
      end
      return sw_describe(p, st, now, { hits = 1, min_hits = 1 },
        { granted = n, allowed = true })
    end,
    is_idle = sw_is_idle,
    -- Counter j (0 = newest) leaves the view once now's sub-window starts
    -- at or after start + (n - j)·S; the newest non-zero one decides, and
    -- rounding that up to a sub-window boundary (the start is one already,
    -- unless the sub-window length changed) gives the exact time.
    ttl = function(p, st, now)
      local n, s = p[2], p[3]
      for j = 0, n - 1 do
        if (st.counts[j + 1] or 0) > 0 then
          local idle_at = st.start + (n - j) * s
          local off = T.mod(idle_at, s)
          if off > 0 then idle_at = idle_at + s - off end
          return sat_sub(idle_at, now)
        end
      end
      return 0
    end,
  }
end
