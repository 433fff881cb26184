-- gaffer for Neovim (>= 0.11): the operator's side. gaffer runs as an LSP server per root
-- (`gaffer serve --lsp`, registered with vim.lsp.config + vim.lsp.enable); the plugin logs in as
-- the operator by challenge-response and signs decisions with `gaffer operator sign` run through
-- vim.system, so the private key never enters the editor.

local M = {}

M.config = {
  -- The gaffer binary.
  gaffer = "gaffer",
  -- The operator's private key file (nil: the CLI's default, $GAFFER_OPERATOR_KEY_FILE or
  -- ~/.config/gaffer/operator.key). Only its path is known here; gaffer reads it to sign.
  key_file = nil,
  -- Equal priority (nested list): the nearest directory with either marker is the root.
  root_markers = { { ".git", ".gaffer" } },
  -- vim.notify on new approvals and on operations reaching a terminal state.
  notify = true,
}

local TERMINAL = { succeeded = true, failed = true, denied = true, canceled = true, expired = true }
local STATE_ORDER = { "pending", "approved", "running", "unknown", "succeeded", "failed", "denied", "canceled", "expired" }

local state = {
  operator = {}, -- client id -> true once logged in
  logs = {}, -- worker id -> bufnr following its output
}

local function notify(msg, level)
  vim.notify("gaffer: " .. msg, level or vim.log.levels.INFO, { title = "gaffer" })
end

--- The environment for gaffer processes that sign (the key path only when configured).
local function sign_env()
  if M.config.key_file then
    return { GAFFER_OPERATOR_KEY_FILE = vim.fs.normalize(M.config.key_file) }
  end
  return nil
end

--- Where gaffer finds the public key beside the private one (`op.key` -> `op.pub`).
function M.public_key_path(key)
  return (key:gsub("%.[^./]*$", "")) .. ".pub"
end

--- Signs `text` with `gaffer operator sign` (payload on stdin, signature on stdout).
function M.sign(text, cb)
  vim.system({ M.config.gaffer, "operator", "sign" }, { stdin = text, text = true, env = sign_env() }, function(r)
    vim.schedule(function()
      if r.code ~= 0 then
        cb(nil, vim.trim(r.stderr or "") ~= "" and vim.trim(r.stderr) or ("gaffer operator sign exited " .. r.code))
      else
        cb(vim.trim(r.stdout), nil)
      end
    end)
  end)
end

--- The gaffer client for the current buffer's root (or any gaffer client).
function M.client()
  local c = vim.lsp.get_clients({ name = "gaffer", bufnr = 0 })[1] or vim.lsp.get_clients({ name = "gaffer" })[1]
  return c
end

--- client:request with an error notification; cb(result) only on success.
function M.request(method, params, cb)
  local c = M.client()
  if not c then
    notify("not running here (no root with " .. table.concat(vim.iter(M.config.root_markers):flatten():totable(), " or ") .. "?)", vim.log.levels.ERROR)
    return
  end
  if params == nil or (type(params) == "table" and next(params) == nil) then
    params = vim.empty_dict() -- `{}` would encode as an array
  end
  c:request(method, params, function(err, result)
    if err then
      notify(method .. ": " .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
      if cb then
        cb(nil, err)
      end
      return
    end
    if cb then
      cb(result)
    end
  end)
end

local function time_left(iso)
  local y, mo, d, h, mi, s = iso:match("^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)")
  if not y then
    return "?"
  end
  local t = os.time({ year = y, month = mo, day = d, hour = h, min = mi, sec = s, isdst = false })
  local now = os.time(os.date("!*t"))
  local left = t - now
  if left <= 0 then
    return "expired"
  end
  if left >= 60 then
    return string.format("%dm %02ds", math.floor(left / 60), left % 60)
  end
  return left .. "s"
end

-- Code points that show nothing, or break, move or reorder what is around them: C0, DEL, C1,
-- line and paragraph separators, bidi marks, overrides and isolates, zero-width characters,
-- BOM, variation selectors, tags and the other format and default-ignorable characters, and
-- surrogates (a JSON `\udXXX` alone). The VS Code extension spells out the same set.
local HIDDEN = {
  { 0x00, 0x1F }, { 0x7F, 0x9F }, { 0xAD, 0xAD }, { 0x34F, 0x34F }, { 0x600, 0x605 },
  { 0x61C, 0x61C }, { 0x6DD, 0x6DD }, { 0x70F, 0x70F }, { 0x890, 0x891 }, { 0x8E2, 0x8E2 },
  { 0x115F, 0x1160 }, { 0x17B4, 0x17B5 }, { 0x180B, 0x180F }, { 0x200B, 0x200F },
  { 0x2028, 0x202E }, { 0x2060, 0x206F }, { 0x3164, 0x3164 }, { 0xD800, 0xDFFF },
  { 0xFE00, 0xFE0F }, { 0xFEFF, 0xFEFF }, { 0xFFA0, 0xFFA0 }, { 0xFFF0, 0xFFFB },
  { 0x110BD, 0x110BD }, { 0x110CD, 0x110CD }, { 0x13430, 0x1343F }, { 0x1BCA0, 0x1BCA3 },
  { 0x1D173, 0x1D17A }, { 0xE0000, 0xE0FFF },
}

local function hidden(cp)
  for _, r in ipairs(HIDDEN) do
    if cp >= r[1] and cp <= r[2] then
      return true
    end
  end
  return false
end

--- The code point of the UTF-8 sequence at byte `i` of `s` and its length in bytes; nil and 1
--- for a byte that starts no sequence.
local function decode(s, i)
  local b = s:byte(i)
  if b < 0x80 then
    return b, 1
  end
  local n = (b >= 0xF0 and b < 0xF5) and 3 or (b >= 0xE0 and b < 0xF0) and 2 or (b >= 0xC2 and b < 0xE0) and 1 or nil
  if not n then
    return nil, 1
  end
  local cp = b % (2 ^ (6 - n))
  for k = 1, n do
    local c = s:byte(i + k)
    if not c or c < 0x80 or c > 0xBF then
      return nil, 1
    end
    cp = cp * 64 + (c - 0x80)
  end
  return cp, n + 1
end

--- Text the agent chose (or could have) as one line that shows what it holds: every hidden
--- character (HIDDEN) written `\u{…}` as `gaffer approve` prints it, a byte that is no UTF-8 as
--- `\x{…}`. `\u{a}` rather than `\n`: in an argv a real line break and the two characters `\n`
--- mean different things. `keep_tabs`: a diff of a file indented with tabs stays readable.
function M.visible(s, keep_tabs)
  s = tostring(s)
  if not s:find("[%z\1-\31\127-\255]") then
    return s
  end
  local out, i = {}, 1
  while i <= #s do
    local cp, len = decode(s, i)
    if not cp then
      table.insert(out, string.format("\\x{%02x}", s:byte(i)))
    elseif hidden(cp) and not (keep_tabs and cp == 9) then
      table.insert(out, string.format("\\u{%x}", cp))
    else
      table.insert(out, s:sub(i, i + len - 1))
    end
    i = i + len
  end
  return table.concat(out)
end

--- One line for an approval in the picker.
function M.format_approval(a)
  return string.format(
    "%s  [%s, %s left]",
    M.visible(a.title or (a.operation .. " (plan does not verify)")),
    M.visible(a.client_id),
    time_left(a.pending_expires_at or "")
  )
end

--- `s` as a POSIX shell reads it: an argv's item boundaries stay visible.
local function shell_quote(s)
  if s:match("^[%w_./:=@%%+-]+$") then
    return s
  end
  return "'" .. s:gsub("'", [['\'']]) .. "'"
end

--- Text the server sends whole (a diff, the plan) as buffer lines, each spelled out.
local function text_lines(text)
  local out = {}
  for _, l in ipairs(vim.split(text, "\n", { plain = true, trimempty = true })) do
    table.insert(out, M.visible(l, true))
  end
  return out
end

--- What approving grants: the mode, uses and time, from the plan's rule (detail) when verified.
local function mode_line(a)
  local d = a.detail
  if not d then
    return string.format("mode %s; requested %ss, %s use(s)", a.mode, a.requested_duration_seconds, a.requested_max_uses)
  end
  local n = d.narrowing
  return string.format(
    "mode %s (%s); at most %ds, %d use(s); request expires in %ds",
    n.mode,
    n.covers,
    n.max_duration_seconds,
    n.max_uses,
    d.expires_in_seconds
  )
end

local function command_lines(c)
  local names = vim.tbl_map(shell_quote, c.env_names)
  return {
    "$ " .. M.visible(table.concat(vim.tbl_map(shell_quote, c.argv), " ")),
    "env: sets " .. (#names > 0 and M.visible(table.concat(names, " ")) or "nothing")
      .. "; inherits " .. table.concat(c.inherited_env or {}, " "),
    "cwd: " .. M.visible(c.cwd ~= "" and c.cwd or "."),
    "killed after " .. c.timeout_ms .. " ms",
  }
end

local function file_change_lines(fc)
  local lines = { M.visible(fc.summary) }
  if not fc.current_matches_plan then
    table.insert(lines, "!! THE FILE CHANGED since the plan was made: this diff is against it as it is now, and running the plan will be refused")
  end
  if fc.diff_truncated then
    table.insert(lines, string.format("!! THE DIFF IS CUT at its size bound: below is less than the whole change (+%d -%d lines)", fc.lines_added, fc.lines_removed))
  end
  vim.list_extend(lines, text_lines(fc.diff or ""))
  return lines
end

--- The preview of an approval (lines, filetype). What decides first: the operation, what
--- approving grants, the argv and env or the diff; the agent's own words (summary, reason)
--- after them. Every string the agent chose is one line with its hidden characters spelled
--- out, so no text of its can pose as a line of the preview or push one out of view.
function M.preview_lines(a)
  local d = a.detail or {}
  local lines = { string.format("# %s, requested by %s", M.visible(a.operation), M.visible(a.client_id)), mode_line(a) }
  if a.plan_problem then
    table.insert(lines, "THIS PLAN CANNOT RUN: " .. M.visible(a.plan_problem))
  end
  table.insert(lines, "")
  if d.command then
    vim.list_extend(lines, command_lines(d.command))
  end
  if d.file_change then
    vim.list_extend(lines, file_change_lines(d.file_change))
  end
  if a.summary then
    vim.list_extend(lines, { "", M.visible(a.summary) })
  end
  if d.plan and not d.file_change then
    vim.list_extend(lines, { "", "plan (the signed digest is over this text):" })
    vim.list_extend(lines, text_lines(d.plan))
    if d.plan_truncated then
      table.insert(lines, "(plan text cut at its size bound)")
    end
  end
  if a.reason then
    vim.list_extend(lines, { "", "the agent says: " .. M.visible(a.reason) })
  end
  return lines, d.file_change and "diff" or "markdown"
end

--- Narrowings the server accepts: shorter durations, fewer uses for a window grant.
function M.narrowing_choices(n)
  local out = { { label = string.format("as requested (%ds, %d use(s))", n.max_duration_seconds, n.max_uses) } }
  if n.duration_narrowable then
    local seen = {}
    for _, s in ipairs({ 60, 300, 900, math.floor(n.max_duration_seconds / 2) }) do
      if s >= 1 and s < n.max_duration_seconds and not seen[s] then
        seen[s] = true
        table.insert(out, { label = string.format("for %ds only", s), duration_seconds = s })
      end
    end
  end
  if n.uses_narrowable then
    for _, u in ipairs({ 1, math.floor(n.max_uses / 2) }) do
      if u >= 1 and u < n.max_uses then
        table.insert(out, { label = string.format("%d use(s) only", u), max_uses = u })
      end
    end
  end
  return out
end

--- After an approval: operations/wait with a workDoneToken until the operation ends, so its
--- progress arrives as `$/progress` (LspProgress). Terminal states are notified from
--- operations/changed.
function M.follow(op_id, done)
  local c = M.client()
  if not c then
    return
  end
  local rev, n = 0, 0
  local function step()
    n = n + 1
    local token = "gaffer-follow-" .. op_id .. "-" .. n
    c:request("operations/wait", { id = op_id, after_revision = rev, wait_seconds = 30, workDoneToken = token }, function(err, op)
      if err or not op then
        return done and done(nil)
      end
      rev = op.revision
      if TERMINAL[op.state] or n >= 20 then
        return done and done(op)
      end
      step()
    end)
  end
  step()
end

--- Why a decision payload is not a decision on the approval `a` as it was shown, or nil: the
--- same request, plan, client, operation and mode, and no more uses or time than shown.
function M.payload_problem(payload, a)
  local ok, p = pcall(vim.json.decode, payload)
  if not ok or type(p) ~= "table" then
    return "the payload is not JSON"
  end
  for _, f in ipairs({
    { "approval_id", a.approval_id },
    { "operation_id", a.operation_id },
    { "client", a.client_id },
    { "operation", a.operation },
    { "plan_digest", a.plan_digest },
    { "mode", a.mode },
  }) do
    if p[f[1]] ~= f[2] then
      return string.format("its %s is %s, not %s as shown", f[1], tostring(p[f[1]]), tostring(f[2]))
    end
  end
  if type(p.max_uses) == "number" and p.max_uses > a.requested_max_uses then
    return string.format("it grants %d uses, more than the %d shown", p.max_uses, a.requested_max_uses)
  end
  if type(p.expires_at_ms) == "number" and type(p.decided_at_ms) == "number" then
    local seconds = (p.expires_at_ms - p.decided_at_ms) / 1000
    if seconds > a.requested_duration_seconds then
      return string.format("it lasts %ds, longer than the %ds shown", seconds, a.requested_duration_seconds)
    end
  end
  return nil
end

--- prepare -> `gaffer operator sign` -> decide. `a` is the approval as the operator was shown
--- it (from approvals/get or approvals/list): the decision binds its revision and plan digest, so
--- a plan swapped behind the same ids since is refused, never signed. opts: constraints, reason.
--- cb(approval|nil, err)
function M.decide(a, decision, opts, cb)
  opts = opts or {}
  cb = cb or function() end
  M.request("approvals/prepare", {
    id = a.approval_id,
    decision = decision,
    expected_revision = a.revision,
    expected_plan_digest = a.plan_digest,
    constraints = opts.constraints,
    reason = opts.reason,
  }, function(prep)
    if not prep then
      return cb(nil, "prepare failed")
    end
    local problem = M.payload_problem(prep.payload, a)
    if problem then
      notify("nothing was signed: the payload is not the approval you were shown (" .. problem .. ")", vim.log.levels.ERROR)
      return cb(nil, "payload mismatch")
    end
    M.sign(prep.payload, function(sig, err)
      if not sig then
        notify("signing failed: " .. err, vim.log.levels.ERROR)
        return cb(nil, err)
      end
      M.request("approvals/decide", { payload = prep.payload, signature = sig }, function(r)
        if r then
          notify(string.format("%s %s", decision == "approve" and "approved" or "denied", M.visible(a.title or a.operation)))
          if decision == "approve" then
            M.follow(a.operation_id)
          end
        end
        cb(r, r and nil or "decide failed")
      end)
    end)
  end)
end

--- The preview float. It cannot be scrolled while vim.ui.select waits, so it is as tall as
--- its wrapped rows (up to what the editor has) and its footer says how many are not shown;
--- it always wraps, so a long line (an argv) is never cut at the right edge.
local function float(lines, ft, title)
  local buf = vim.api.nvim_create_buf(false, true)
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].filetype = ft
  vim.bo[buf].modifiable = false
  vim.bo[buf].bufhidden = "wipe"
  local width = math.min(math.max(60, math.floor(vim.o.columns * 0.7)), vim.o.columns - 4)
  local room = math.max(5, vim.o.lines - 8)
  local win = vim.api.nvim_open_win(buf, false, {
    relative = "editor",
    row = 1,
    col = math.floor((vim.o.columns - width) / 2),
    width = width,
    height = room,
    border = "rounded",
    title = " gaffer: " .. vim.fn.strcharpart(title, 0, width - 12) .. " ",
    style = "minimal",
  })
  vim.wo[win].wrap = true
  local rows = vim.api.nvim_win_text_height(win, {}).all
  local cfg = { height = math.min(rows, room) }
  if rows > room then
    cfg.footer = string.format(" %d more rows below, not shown ", rows - room)
  end
  vim.api.nvim_win_set_config(win, cfg)
  return win, buf
end

--- :Gaffer approvals — pick one, read its plan/diff in a float, approve / narrower / deny.
function M.approvals(done)
  done = done or function() end
  M.request("approvals/list", {}, function(r)
    if not r then
      return done()
    end
    if #r.approvals == 0 then
      notify("nothing is waiting for you")
      return done()
    end
    vim.ui.select(r.approvals, { prompt = "gaffer approvals", format_item = M.format_approval, kind = "gaffer.approval" }, function(pick)
      if not pick then
        return done()
      end
      M.request("approvals/get", { id = pick.approval_id }, function(a)
        if not a then
          return done()
        end
        local lines, ft = M.preview_lines(a)
        local win = float(lines, ft, M.visible(a.title or a.operation))
        M.last_preview = lines
        local close = function()
          if vim.api.nvim_win_is_valid(win) then
            vim.api.nvim_win_close(win, true)
          end
        end
        local actions = { "Approve", "Approve narrower…", "Deny…", "Cancel" }
        vim.ui.select(actions, { prompt = M.visible(a.title or a.operation), kind = "gaffer.action" }, function(act)
          if act == "Approve" then
            close()
            M.decide(a, "approve", {}, done)
          elseif act == "Approve narrower…" then
            if not a.detail then
              close()
              notify(a.plan_problem or "this plan cannot be approved", vim.log.levels.ERROR)
              return done()
            end
            local choices = M.narrowing_choices(a.detail.narrowing)
            vim.ui.select(choices, {
              prompt = "How much to allow",
              format_item = function(c)
                return c.label
              end,
              kind = "gaffer.narrowing",
            }, function(c)
              close()
              if not c then
                return done()
              end
              M.decide(
                a,
                "approve",
                { constraints = { duration_seconds = c.duration_seconds, max_uses = c.max_uses } },
                done
              )
            end)
          elseif act == "Deny…" then
            vim.ui.input({ prompt = "Reason (the agent receives it): " }, function(reason)
              close()
              if reason == nil then
                return done()
              end
              M.decide(a, "deny", { reason = reason ~= "" and reason or nil }, done)
            end)
          else
            close()
            done()
          end
        end)
      end)
    end)
  end)
end

local function scratch(name, lines, ft)
  local buf = vim.fn.bufnr(name)
  if buf == -1 then
    buf = vim.api.nvim_create_buf(true, true)
    vim.api.nvim_buf_set_name(buf, name)
    vim.bo[buf].buftype = "nofile"
    vim.bo[buf].swapfile = false
  end
  vim.bo[buf].modifiable = true
  vim.api.nvim_buf_set_lines(buf, 0, -1, false, lines)
  vim.bo[buf].modifiable = false
  vim.bo[buf].filetype = ft or "gaffer"
  vim.api.nvim_set_current_buf(buf)
  return buf
end

--- Operations grouped by state (attention first), as lines.
function M.operation_lines(ops)
  local by = {}
  for _, op in ipairs(ops) do
    by[op.state] = by[op.state] or {}
    table.insert(by[op.state], op)
  end
  local order = vim.deepcopy(STATE_ORDER)
  for s in pairs(by) do
    if not vim.tbl_contains(order, s) then
      table.insert(order, s)
    end
  end
  local lines = {}
  for _, s in ipairs(order) do
    if by[s] then
      table.insert(lines, string.format("%s (%d)", s, #by[s]))
      for _, op in ipairs(by[s]) do
        local title = op.presentation and op.presentation.title or op.operation
        local err = op.error and ("  — " .. op.error.message) or ""
        -- One line per operation: what the agent's text holds is shown, never obeyed.
        table.insert(lines, M.visible(string.format("  %s  %s  [%s]%s", op.id, title, op.client_id, err)))
      end
    end
  end
  if #lines == 0 then
    lines = { "no operations" }
  end
  return lines
end

--- :Gaffer ops
function M.ops(done)
  M.request("operations/list", { limit = 200 }, function(r)
    if r then
      scratch("gaffer://operations", M.operation_lines(r.operations))
    end
    if done then
      done(r)
    end
  end)
end

--- :Gaffer workers — pick one: follow its output or stop it.
function M.workers(done)
  done = done or function() end
  M.request("workers/list", {}, function(r)
    if not r or #r.workers == 0 then
      notify("no workers")
      return done()
    end
    vim.ui.select(r.workers, {
      prompt = "gaffer workers",
      format_item = function(w)
        return M.visible(string.format("%s  %s  (%s)", w.id, w.display_name or "", w.status))
      end,
      kind = "gaffer.worker",
    }, function(w)
      if not w then
        return done()
      end
      vim.ui.select({ "Logs", "Stop", "Cancel" }, { prompt = w.id }, function(act)
        if act == "Logs" then
          M.logs(w.id, done)
        elseif act == "Stop" then
          M.request("workers/stop", { worker_id = w.id, reason = "stopped from Neovim" }, function()
            done()
          end)
        else
          done()
        end
      end)
    end)
  end)
end

--- A transcript entry as shown: input as `> …`, gaffer's notes as `[gaffer] …`, stderr `! …`.
function M.transcript_text(stream, text)
  local function lines(prefix)
    local out = {}
    for _, l in ipairs(vim.split((text:gsub("\n$", "")), "\n", { plain = true })) do
      table.insert(out, prefix .. l)
    end
    return table.concat(out, "\n") .. "\n"
  end
  if stream == "input" then
    return lines("> ")
  elseif stream == "system" then
    return lines("[gaffer] ")
  elseif stream == "stderr" then
    return (text:gsub("([^\n]+)", "! %1"))
  end
  return text
end

local function follow(buf)
  for _, win in ipairs(vim.fn.win_findbuf(buf)) do
    vim.api.nvim_win_set_cursor(win, { vim.api.nvim_buf_line_count(buf), 0 })
  end
end

local function append(buf, text)
  if not vim.api.nvim_buf_is_valid(buf) then
    return
  end
  local parts = vim.split(text, "\n", { plain = true })
  vim.bo[buf].modifiable = true
  local last = vim.api.nvim_buf_line_count(buf)
  local tail = vim.api.nvim_buf_get_lines(buf, last - 1, last, false)[1] or ""
  parts[1] = tail .. parts[1]
  vim.api.nvim_buf_set_lines(buf, last - 1, last, false, parts)
  vim.bo[buf].modifiable = false
  follow(buf)
end

--- :Gaffer logs {id} — a scratch buffer with the transcript that follows new output.
function M.logs(id, done)
  if not id or id == "" then
    return notify("usage: :Gaffer logs {worker id}", vim.log.levels.ERROR)
  end
  local buf = scratch("gaffer://logs/" .. id, { "" }, "gaffer_log")
  state.logs[id] = buf
  local function page(after)
    M.request("workers/transcript", { worker_id = id, after_seq = after, limit = 500 }, function(r)
      if not r then
        return done and done()
      end
      for _, e in ipairs(r.entries) do
        append(buf, M.transcript_text(e.stream, e.text))
      end
      state.seen = state.seen or {}
      state.seen[id] = r.next_after_seq
      if r.has_more then
        page(r.next_after_seq)
      elseif done then
        done(buf)
      end
    end)
  end
  page(0)
  return buf
end

--- :Gaffer plan — pattern, lanes, mechanism and proof expectations for a task.
function M.plan(objective, done)
  local function run(obj)
    if not obj or obj == "" then
      return done and done()
    end
    M.request("patterns/select", { objective = obj, output = "select" }, function(r)
      if not r then
        return done and done()
      end
      local p = r.plan or {}
      local sel, rt = p.selection or {}, p.runtime_mapping or {}
      local lines = {
        "# Plan: " .. obj,
        "",
        "- pattern: **" .. tostring(sel.selected_pattern) .. "**" .. ((sel.overlays and #sel.overlays > 0) and (" + " .. table.concat(sel.overlays, ", ")) or ""),
        "- why: " .. tostring(sel.reason or ""),
        "- mechanism: **" .. tostring(rt.primary_mechanism) .. "**",
        "",
        "## Lanes",
        "",
      }
      for _, l in ipairs(p.lanes or {}) do
        table.insert(lines, string.format("- %s [%s] %s", l.role or "", table.concat(l.scope or {}, ", "), l.purpose or ""))
      end
      vim.list_extend(lines, { "", "## Proof expectations", "" })
      for _, e in ipairs(p.proof_expectations or {}) do
        table.insert(lines, "- [ ] " .. e)
      end
      local buf = scratch("gaffer://plan", lines, "markdown")
      if done then
        done(buf)
      end
    end)
  end
  if objective and objective ~= "" then
    run(objective)
  else
    vim.ui.input({ prompt = "Task: " }, run)
  end
end

-- --- notifications from the server ----------------------------------------------------------

local handlers = {}

handlers["approvals/requested"] = function(_, p)
  M.pending = (M.pending or 0) + 1
  if M.config.notify then
    notify(
      M.visible(string.format("%s wants: %s — :Gaffer approvals", p.client_id or "an agent", p.title or p.operation or "?")),
      vim.log.levels.WARN
    )
  end
end

handlers["operations/changed"] = function(_, p)
  if M.config.notify and p and TERMINAL[p.state] then
    notify(string.format("%s %s %s", p.operation or "operation", p.id, p.state))
  end
end

handlers["workers/output"] = function(_, p)
  local buf = p and state.logs[p.worker_id]
  if buf and vim.api.nvim_buf_is_valid(buf) then
    if state.seen and state.seen[p.worker_id] and p.seq and p.seq <= state.seen[p.worker_id] then
      return
    end
    append(buf, M.transcript_text(p.stream, p.text))
  end
end

handlers["workers/changed"] = function() end

local function login(client, init_result)
  local challenge = init_result and init_result.operatorChallenge
  if type(challenge) ~= "string" then
    notify("this gaffer offered no operator challenge; approvals are unavailable", vim.log.levels.WARN)
    return
  end
  M.sign(challenge, function(sig, err)
    if not sig then
      notify("operator login: " .. err, vim.log.levels.WARN)
      return
    end
    client:request("operator/login", { signature = sig }, function(e)
      if e then
        notify("operator login refused: " .. (e.message or "?"), vim.log.levels.WARN)
      else
        state.operator[client.id] = true
        vim.api.nvim_exec_autocmds("User", { pattern = "GafferOperator", data = { client_id = client.id } })
      end
    end)
  end)
end

--- Whether the client (default: the current one) is logged in as the operator.
function M.is_operator(client)
  client = client or M.client()
  return client ~= nil and state.operator[client.id] == true
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", M.config, opts or {})
  local env = nil
  if M.config.key_file then
    env = { GAFFER_OPERATOR_PUBLIC_KEY_FILE = M.public_key_path(vim.fs.normalize(M.config.key_file)) }
  end
  vim.lsp.config("gaffer", {
    cmd = { M.config.gaffer, "serve", "--lsp" },
    cmd_env = env,
    root_markers = M.config.root_markers,
    init_options = { role = "operator" },
    handlers = handlers,
    on_init = login,
  })
  vim.lsp.enable("gaffer")
  vim.api.nvim_create_autocmd("LspProgress", {
    group = vim.api.nvim_create_augroup("gaffer.progress", { clear = true }),
    callback = function(ev)
      local c = vim.lsp.get_client_by_id(ev.data.client_id)
      local v = ev.data.params and ev.data.params.value
      if c and c.name == "gaffer" and type(v) == "table" and (v.message or v.title) then
        M.progress_log = M.progress_log or {}
        table.insert(M.progress_log, { kind = v.kind, title = v.title, message = v.message })
        vim.api.nvim_echo({ { "gaffer: " .. M.visible((v.title or "") .. " " .. (v.message or "")) } }, false, {})
      end
    end,
  })
  vim.api.nvim_create_user_command("Gaffer", function(c)
    local sub, arg = c.fargs[1], c.fargs[2]
    if sub == "approvals" then
      M.approvals()
    elseif sub == "ops" then
      M.ops()
    elseif sub == "workers" then
      M.workers()
    elseif sub == "logs" then
      M.logs(arg)
    elseif sub == "plan" then
      M.plan(table.concat(vim.list_slice(c.fargs, 2), " "))
    else
      notify("usage: :Gaffer approvals|ops|workers|logs {id}|plan [task]", vim.log.levels.ERROR)
    end
  end, {
    nargs = "+",
    complete = function()
      return { "approvals", "ops", "workers", "logs", "plan" }
    end,
  })
end

return M
