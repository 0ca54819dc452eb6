-- The fixed window counter (code 4): a port of
-- crates/core/src/algorithms/fixed_window.rs. The state is the start of the
-- window its count belongs to, and that count; a fresh state counts
-- nothing (its start, the epoch, is long ago).
-- Parameters: p[1] limit, p[2] window, p[3] align (0 epoch, 1 first hit,
-- 2 calendar); with a calendar, p[4] .. p[11] are four edges, each as
-- seconds and nanoseconds since the epoch: e0 = (p[4], p[5]), e1, e2, e3,
-- the windows [e0, e1), [e1, e2) and [e2, e3) around the server's time.
-- Last (p[#p], after the edges) max_debt, the hits a report may count
-- beyond the limit.
-- Stored: v[3] start (T.put), v[4] count; a calendar window also v[5],
-- its end (T.put), which no arithmetic on p[2] gives.
--
-- Calendar windows. Lua has no time zone database, so the server computes
-- the edges (crates/core/src/calendar.rs) around its own time and sends
-- three windows; the script takes the one holding its `now` (Redis's
-- TIME, so the edge is Redis's clock, as every other decision's time is,
-- while the server's clock is within a window of it). A `now` outside all
-- three (a server clock off by more than a window) takes the server's
-- window. Relative edges are exact: a month's three windows span under
-- 100 days, below 2^53 ns, and the store refuses calendar windows longer
-- than a month (params.rs).
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[4] = function()

  -- Edge `i` (0 to 3) of a calendar's parameters, relative to now.
  local function fw_edge(p, i)
    return (p[4 + 2 * i] - T.S) * 1000000000 + (p[5 + 2 * i] - T.NS)
  end

  -- The end of the window the state's count belongs to.
  local function fw_stop(p, st)
    if p[3] == 2 then return st.stop end
    return st.start + p[2]
  end

  -- Whether the stored window still covers `now`. A time before the window
  -- (a clock going backwards) keeps it: forgetting hits because time went
  -- backwards would be an exploit.
  local function fw_current(p, st, now)
    return st.count > 0 and now < fw_stop(p, st)
  end

  local function fw_count(p, st, now)
    if fw_current(p, st, now) then return st.count end
    return 0
  end

  -- The window a grant at `now` starts: its start and end.
  local function fw_window(p, now)
    -- Epoch windows start at multiples of the window since the Unix epoch,
    -- which only the absolute time knows.
    if p[3] == 0 then
      local start = now - T.mod(now, p[2])
      return start, start + p[2]
    end
    if p[3] == 1 then return now, now + p[2] end
    local e0, e1, e2, e3 = fw_edge(p, 0), fw_edge(p, 1), fw_edge(p, 2), fw_edge(p, 3)
    if now >= e0 and now < e1 then return e0, e1 end
    if now >= e2 and now < e3 then return e2, e3 end
    return e1, e2
  end

  ALG[4] = {
    name = 'fixed_window',
    fresh = function(p, now) return { start = PAST, count = 0, stop = PAST } end,
    decode = function(p, v, base)
      local st = { start = T.get(v[3], base), count = v[4], stop = PAST }
      if p[3] == 2 and v[5] then st.stop = T.get(v[5], base) end
      return st
    end,
    encode = function(p, st)
      if p[3] == 2 then return { T.put(st.start), st.count, T.put(st.stop) } end
      return { T.put(st.start), st.count }
    end,
    room = function(p, st, now, hits)
      return min(sat_sub(p[1], fw_count(p, st, now)), hits)
    end,
    commit = function(p, st, now, req, grant)
      if grant.granted > 0 then
        if not fw_current(p, st, now) then
          st.start, st.stop = fw_window(p, now)
          st.count = 0
        end
        st.count = st.count + grant.granted
      end
      local count = fw_count(p, st, now)
      local until_end = 0
      if count > 0 then until_end = sat_sub(fw_stop(p, st), now) end
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
    ttl = function(p, st, now)
      if not fw_current(p, st, now) then return 0 end
      return sat_sub(fw_stop(p, st), now)
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
