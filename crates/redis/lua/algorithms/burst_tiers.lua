-- Charon's burst tiers (code 8): a port of
-- crates/core/src/algorithms/burst_tiers.rs, on the shared HitLog.
-- Parameters: p[1] tier count, then per tier i (from p[5i - 3]): limit,
-- window, active, cooldown, skippable (0/1).
-- Stored: v[3] tier count, then per tier: entered (T.put, or false for
-- the core's NEVER), its log's entry count, and the log in HitLog's
-- layout.
-- A stored state with another tier count is read as fresh: the core
-- decides such a state as fresh, and burst tiers never schedule, so no
-- path sees it otherwise. Relative times need none of the core's
-- saturation (a real now is decades past any span).
-- Wrapped in a loader, run on first use (see LOADERS in prelude.lua); its
-- locals do not count against the chunk's 200.
LOADERS[8] = function()
  hit_log_load()

  local INACTIVE, ACTIVE, COOLDOWN = 0, 1, 2
  -- The core walks u64::MAX hits for `remaining`; a walk only ever takes
  -- min(left, room), so any number past every tier's room answers alike.
  local UNLIMITED = TWO53

  local function bt_limit(p, i) return p[5 * i - 3] end
  local function bt_window(p, i) return p[5 * i - 2] end
  local function bt_active(p, i) return p[5 * i - 1] end
  local function bt_cooldown(p, i) return p[5 * i] end
  local function bt_skippable(p, i) return p[5 * i + 1] == 1 end

  local function bt_phase(p, sts, i, now)
    local entered = sts[i].entered
    if not entered then return INACTIVE end
    local active_end = entered + bt_active(p, i)
    if now < active_end then return ACTIVE end
    if now < active_end + bt_cooldown(p, i) then return COOLDOWN end
    return INACTIVE
  end

  -- The current tier at `now` (0: the fake tier).
  local function bt_current(p, sts, now)
    for i = p[1], 1, -1 do
      if bt_phase(p, sts, i, now) == ACTIVE then return i end
    end
    return 0
  end

  local function bt_count(p, sts, i, now)
    return HitLog.count_since(sts[i].log, now - bt_window(p, i))
  end

  -- The tier a burst from `from` enters, skipping skippable tiers in
  -- cooldown; nil if the burst is blocked or there is no tier above.
  local function bt_burst_target(p, sts, now, from)
    for j = from + 1, p[1] do
      local ph = bt_phase(p, sts, j, now)
      if ph ~= COOLDOWN then return j end
      if not bt_skippable(p, j) then return nil end
    end
    return nil
  end

  -- Walks `hits` through the tiers at `now` without changing anything:
  -- {granted=, takes={{tier, hits}...}, entered={tier...}}.
  local function bt_walk(p, sts, now, hits)
    local w = { granted = 0, takes = {}, entered = {} }
    local left = hits
    local c = bt_current(p, sts, now)
    while true do
      if c > 0 then
        local used = bt_count(p, sts, c, now)
        local take = min(sat_sub(bt_limit(p, c), used), left)
        if take > 0 then
          w.takes[#w.takes + 1] = { c, take }
          w.granted = w.granted + take
          left = left - take
        end
      end
      if left == 0 then break end
      local j = bt_burst_target(p, sts, now, c)
      if not j then break end
      w.entered[#w.entered + 1] = j
      c = j
    end
    return w
  end

  -- The next instant after `t` at which some tier changes phase, or nil.
  local function bt_next_transition(p, sts, t)
    local nxt = nil
    for i = 1, p[1] do
      local entered = sts[i].entered
      if entered then
        local active_end = entered + bt_active(p, i)
        local edges = { active_end, active_end + bt_cooldown(p, i) }
        for _, edge in ipairs(edges) do
          if edge > t and (nxt == nil or edge < nxt) then nxt = edge end
        end
      end
    end
    return nxt
  end

  -- The earliest time from `now` at which min_hits would be granted with
  -- no other traffic (false: never). Between two transitions the windows
  -- only empty, so what a walk admits only grows and a binary search finds
  -- the first instant; it runs on relative nanoseconds, where lo + (hi -
  -- lo) / 2 rounds down exactly as the core's absolute midpoint does.
  local function bt_retry_after(p, sts, now, min_hits)
    if min_hits == 0 then return 0 end
    local function admits(t)
      return bt_walk(p, sts, t, min_hits).granted >= min_hits
    end
    -- nil: no hit anywhere, the core's Nanos::ZERO (long ago).
    local settled = nil
    for i = 1, p[1] do
      local newest = HitLog.newest(sts[i].log)
      if newest then
        local s = newest + bt_window(p, i)
        if settled == nil or s > settled then settled = s end
      end
    end
    if settled then settled = settled + 1 end
    local start = now
    while true do
      local nxt = bt_next_transition(p, sts, start)
      -- The segment [start, stop) has fixed phases.
      local stop = nxt
      if not stop then stop = max(settled or start, start) + 1 end
      local last = stop - 1
      if admits(last) then
        local lo, hi = start, last
        while lo < hi do
          local mid = lo + floor((hi - lo) / 2)
          if admits(mid) then hi = mid else lo = mid + 1 end
        end
        return sat_sub(lo, now)
      end
      -- Transitions lie strictly after `start`: the loop ends.
      if nxt and nxt > start then
        start = nxt
      else
        return false
      end
    end
  end

  local function bt_fresh(p)
    local sts = {}
    for i = 1, p[1] do sts[i] = { entered = false, log = HitLog.new() } end
    return sts
  end

  ALG[8] = {
    name = 'burst_tiers',
    fresh = function(p, now) return { tiers = bt_fresh(p) } end,
    decode = function(p, v, base)
      if v[3] ~= p[1] then return { tiers = bt_fresh(p) } end
      local sts = {}
      local at = 4
      for i = 1, p[1] do
        local entered = v[at]
        if entered then entered = T.get(entered, base) end
        local log
        log, at = HitLog.decode(v, at + 2, v[at + 1], base)
        sts[i] = { entered = entered, log = log }
      end
      return { tiers = sts }
    end,
    encode = function(p, st)
      local out = { p[1] }
      for i = 1, p[1] do
        local s = st.tiers[i]
        local entered = false
        if s.entered then entered = T.put(s.entered) end
        out[#out + 1] = entered
        out[#out + 1] = HitLog.len(s.log)
        HitLog.encode(s.log, out)
      end
      return out
    end,
    room = function(p, st, now, hits)
      return bt_walk(p, st.tiers, now, hits).granted
    end,
    commit = function(p, st, now, req, grant)
      local sts = st.tiers
      -- Forget ended periods, and hits that left the windows.
      for i = 1, p[1] do
        if bt_phase(p, sts, i, now) == INACTIVE then sts[i].entered = false end
        HitLog.prune(sts[i].log, now - bt_window(p, i))
      end
      local burst = false
      if grant.granted > 0 then
        local w = bt_walk(p, sts, now, grant.granted)
        for _, j in ipairs(w.entered) do
          sts[j].entered = now
          burst = true
        end
        for _, take in ipairs(w.takes) do
          HitLog.push(sts[take[1]].log, now, take[2], bt_limit(p, take[1]))
        end
      end
      local c = bt_current(p, sts, now)
      local limit, hits = 0, 0
      if c > 0 then
        limit = bt_limit(p, c)
        hits = bt_count(p, sts, c, now)
      end
      -- Fresh again once every period has ended and every window emptied.
      local reset_after = 0
      for i = 1, p[1] do
        local s = sts[i]
        local edge = PAST
        if s.entered then
          edge = s.entered + bt_active(p, i) + bt_cooldown(p, i)
        end
        local newest = HitLog.newest(s.log)
        if newest then edge = max(edge, newest + bt_window(p, i) + 1) end
        reset_after = max(reset_after, sat_sub(edge, now))
      end
      return {
        granted = grant.granted,
        allowed = grant.allowed,
        limit = limit,
        remaining = bt_walk(p, sts, now, UNLIMITED).granted,
        reset_after = reset_after,
        retry_after = bt_retry_after(p, sts, now, req.min_hits),
        wait = 0,
        tier = { index = c, limit = limit, hits = hits, burst = burst },
      }
    end,
    is_idle = function(p, st, now)
      for i = 1, p[1] do
        if bt_phase(p, st.tiers, i, now) ~= INACTIVE then return false end
        if bt_count(p, st.tiers, i, now) ~= 0 then return false end
      end
      return true
    end,
    -- Idle once every period has ended and every window emptied: the
    -- latest such edge, which is what reset_after reports.
    ttl = function(p, st, now)
      local ttl = 0
      for i = 1, p[1] do
        local s = st.tiers[i]
        if s.entered then
          ttl = max(ttl, sat_sub(s.entered + bt_active(p, i) + bt_cooldown(p, i), now))
        end
        local newest = HitLog.newest(s.log)
        if newest then
          ttl = max(ttl, sat_sub(newest + bt_window(p, i) + 1, now))
        end
      end
      return ttl
    end,
  }
end
