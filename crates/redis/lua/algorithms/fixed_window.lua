-- The fixed window counter (code 4): a port of
-- crates/core/src/algorithms/fixed_window.rs. The state is the window its
-- count belongs to, and that count; a fresh state counts nothing (its
-- window, long ago, is over).
-- Parameters: p[1] limit, p[2] window, p[3] align (0 epoch, 1 first hit,
-- 2 calendar); with a calendar, p[4] .. p[11] are four edges, each as
-- seconds and nanoseconds since the epoch: e0 = (p[4], p[5]), e1, e2, e3,
-- the windows [e0, e1), [e1, e2) and [e2, e3) around the server's time.
-- Last (p[#p], after the edges) max_debt, the hits a report may count
-- beyond the limit.
-- Stored, epoch and first-hit windows: v[3] start (T.put), v[4] count.
-- Stored, calendar windows: v[3] 0 (unused: a calendar window's state is
-- its end, as in the core; older scripts stored the start there and never
-- read it back), v[4] count, v[5] and v[6] the window's end: v[6] seconds
-- plus v[5] nanoseconds after the base second v[2]. v[6] is written only
-- when the end is 2^53 ns or more from the base second (a year's window);
-- otherwise v[5] alone holds the whole offset in nanoseconds, the layout
-- scripts before calendar years wrote, so that days, weeks and months are
-- stored as they were and states of either layout read back alike (an
-- absent v[6] is 0 seconds).
--
-- Calendar windows. Lua has no time zone database, so the server computes
-- the edges (crates/core/src/calendar.rs) around its own time and sends
-- three windows; the script takes the one holding its `now` (Redis's
-- TIME, so the edge is Redis's clock, as every other decision's time is,
-- while the server's clock is within a window of it). A `now` before all
-- three (a server clock more than a window ahead) takes the server's
-- window; a `now` after all three (more than a window behind), whose
-- windows are all over, counts its hits for the length of the server's
-- window from now, never into a window already over (which would grant
-- every hit and count none).
--
-- A year's three windows span up to three years, and its reset_after up
-- to a year: past 2^53 ns (104 days), where a relative time in
-- nanoseconds with an arbitrary nanosecond part (the caller's clock, in
-- tests and replays) is no longer exact. So calendar windows never form
-- such a count: their edges and end are pairs (`cal`): whole seconds and
-- nanoseconds (0 to 1e9 - 1) after now. Seconds times 1e9 is exact (a
-- multiple of 2^9 well below 2^62), a pair is compared with now by its
-- parts, and the time to the end leaves the script as a number when it is
-- below 2^53 ns (exact), else as the array {seconds, nanoseconds}, which
-- crates/redis/src/reply.rs reassembles into the exact u64. Every day,
-- week and month (and a year's last 104 days) answers as a plain number,
-- as before.
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[4] = function()

  local BILLION = 1000000000

  -- The calendar time `s` seconds plus `ns` nanoseconds after now (both
  -- whole, |ns| < 2^53), as a pair {s =, ns =} with 0 <= ns < 1e9.
  -- floor(ns / 1e9) is exact for |ns| < 2^53 (see idiv in prelude.lua;
  -- for a negative ns the quotient is as far from the next integer).
  local function cal(s, ns)
    local c = floor(ns / BILLION)
    return { s = s + c, ns = ns - c * BILLION }
  end

  -- Whether the calendar time `t` is after now.
  local function cal_after(t)
    return t.s > 0 or (t.s == 0 and t.ns > 0)
  end

  -- Long ago, for a fresh calendar state: never after now.
  local function cal_past()
    return { s = -4611686018, ns = 0 }
  end

  -- Edge `i` (0 to 3) of a calendar's parameters.
  local function fw_edge(p, i)
    return cal(p[4 + 2 * i] - T.S, p[5 + 2 * i] - T.NS)
  end

  -- The time from now to `t` (after now) as the reply carries it: exact
  -- nanoseconds below 2^53, else {seconds, nanoseconds}. The sum is exact
  -- when the true value is below 2^53, and rounding never takes a larger
  -- one below it.
  local function cal_until(t)
    local n = t.s * BILLION + t.ns
    if n < TWO53 then return n end
    return { t.s, t.ns }
  end

  -- Whether the stored window still covers `now` (0: the script's now,
  -- which calendar pairs are relative to). A time before the window (a
  -- clock going backwards) keeps it: forgetting hits because time went
  -- backwards would be an exploit.
  local function fw_current(p, st, now)
    if st.count <= 0 then return false end
    if p[3] == 2 then return cal_after(st.stop) end
    return now < st.start + p[2]
  end

  local function fw_count(p, st, now)
    if fw_current(p, st, now) then return st.count end
    return 0
  end

  -- The time from now to the end of the current window (see cal_until).
  local function fw_until_end(p, st, now)
    if p[3] == 2 then return cal_until(st.stop) end
    return sat_sub(st.start + p[2], now)
  end

  -- Starts the window a grant at `now` starts: its start, or a calendar
  -- window's end.
  local function fw_start(p, st, now)
    -- Epoch windows start at multiples of the window since the Unix epoch,
    -- which only the absolute time knows.
    if p[3] == 0 then
      st.start = now - T.mod(now, p[2])
    elseif p[3] == 1 then
      st.start = now
    else
      local e0, e1, e2, e3 = fw_edge(p, 0), fw_edge(p, 1), fw_edge(p, 2), fw_edge(p, 3)
      if not cal_after(e0) and cal_after(e1) then
        st.stop = e1
      elseif not cal_after(e2) and cal_after(e3) then
        st.stop = e3
      elseif cal_after(e2) then
        -- Before every window (a server clock more than a window ahead):
        -- the server's window.
        st.stop = e2
      else
        -- After every window (a server clock more than a window behind):
        -- the server's window is over by Redis's clock, and hits counted
        -- into it would be forgotten at once (every hit granted). They
        -- count for that window's length from now instead.
        st.stop = cal(e2.s - e1.s, e2.ns - e1.ns)
      end
    end
  end

  ALG[4] = {
    name = 'fixed_window',
    fresh = function(p, now)
      if p[3] == 2 then return { count = 0, stop = cal_past() } end
      return { start = PAST, count = 0 }
    end,
    decode = function(p, v, base)
      if p[3] == 2 then
        local stop = cal_past()
        if v[5] then stop = cal(base - T.S + (v[6] or 0), v[5] - T.NS) end
        return { count = v[4], stop = stop }
      end
      return { start = T.get(v[3], base), count = v[4] }
    end,
    encode = function(p, st)
      if p[3] == 2 then
        -- The end relative to the base second T.S: s seconds and ns
        -- nanoseconds (ns < 2e9).
        local s, ns = st.stop.s, st.stop.ns + T.NS
        local n = s * BILLION + ns
        if n > -TWO53 and n < TWO53 then return { 0, st.count, n } end
        if ns >= BILLION then s, ns = s + 1, ns - BILLION end
        return { 0, st.count, ns, s }
      end
      return { T.put(st.start), st.count }
    end,
    room = function(p, st, now, hits)
      return min(sat_sub(p[1], fw_count(p, st, now)), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then
        if not fw_current(p, st, now) then
          fw_start(p, st, now)
          st.count = 0
        end
        st.count = st.count + grant.granted
      end
      local count = fw_count(p, st, now)
      local until_end = 0
      if count > 0 then until_end = fw_until_end(p, st, now) end
      local retry_after
      if req.min_hits > p[1] then
        retry_after = false
      elseif count + req.min_hits <= p[1] then
        retry_after = 0
      else
        retry_after = until_end
      end
      return {
        granted = grant.granted,
        allowed = grant.allowed,
        limit = p[1],
        remaining = sat_sub(p[1], count),
        reset_after = until_end,
        retry_after = retry_after,
        wait = 0,
      }
    end,
    is_idle = function(p, st, now) return not fw_current(p, st, now) end,
    -- A year's end 2^53 ns or more away: the whole second after it, an
    -- exact bound never short of it.
    ttl = function(p, st, now)
      if not fw_current(p, st, now) then return 0 end
      local t = fw_until_end(p, st, now)
      if type(t) == 'table' then return (t[1] + 1) * BILLION end
      return t
    end,
  }

  -- Usage::report and refund, through commit as in the core: a report is
  -- a grant the limit did not check, a refund uncounts hits first.
  ALG[4].usage = function(p, st, now, hits, refund)
    local one = { hits = 1, min_hits = 1 }
    if refund then
      local back = min(hits, fw_count(p, st, now))
      st.count = st.count - back
      local d = ALG[4].commit(p, st, now, one, { granted = 0, allowed = true })
      d.granted = back
      return d
    end
    local n = min(hits, sat_sub(p[1] + p[#p], fw_count(p, st, now)))
    return ALG[4].commit(p, st, now, one, { granted = n, allowed = true })
  end
end
