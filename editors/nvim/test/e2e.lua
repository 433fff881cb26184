-- The plugin inside a real headless Neovim against the real gaffer binary. An agent in another
-- process (a second `gaffer serve --jsonl` on the same workspace, driven from here) submits;
-- the human's answers go through the plugin's own vim.ui.select / vim.ui.input calls, which
-- this script answers the way a user would pick from the list.
-- Env: GAFFER_BIN, WS (workspace), KEY (operator key file), OUT.

local GAFFER, WS, KEY, OUT = vim.env.GAFFER_BIN, vim.env.WS, vim.env.KEY, vim.env.OUT
local T0 = vim.uv.hrtime()
local function say(...)
  io.stdout:write(string.format("[nvim e2e +%.1fs] ", (vim.uv.hrtime() - T0) / 1e9) .. table.concat({ ... }, " ") .. "\n")
end
local function fail(msg)
  io.stdout:write("[nvim e2e] FAIL: " .. msg .. "\n")
  vim.cmd("cquit 1")
end
local function expect(cond, what)
  if not cond then
    fail("expectation failed: " .. what)
  end
  say("ok - " .. what)
end
local function wait(pred, ms, what)
  if not vim.wait(ms, pred, 20) then
    fail("timed out waiting for " .. what)
  end
end

-- Record notifications with the time they were raised.
local notes = {}
vim.notify = function(msg, level)
  table.insert(notes, { msg = msg, level = level, t = vim.uv.hrtime() })
  say("notify: " .. msg)
end
local function note_with(needle)
  for _, n in ipairs(notes) do
    if n.msg:find(needle, 1, true) then
      return n
    end
  end
end

-- The user's answers, consumed in order by vim.ui.select / vim.ui.input.
local answers = {}
local seen_items = {}
-- Called while the action picker waits, the preview float open: what the operator sees then.
local on_action
vim.ui.select = function(items, opts, on_choice)
  if opts.kind == "gaffer.action" and on_action then
    on_action()
  end
  local a = table.remove(answers, 1)
  if not a then
    fail("unexpected vim.ui.select: " .. (opts.prompt or ""))
  end
  local shown = {}
  for _, it in ipairs(items) do
    table.insert(shown, opts.format_item and opts.format_item(it) or tostring(it))
  end
  seen_items[#seen_items + 1] = shown
  for i, s in ipairs(shown) do
    if s:find(a, 1, true) then
      return vim.schedule(function()
        on_choice(items[i], i)
      end)
    end
  end
  fail(string.format("no item matching %q in %s", a, vim.inspect(shown)))
end
vim.ui.input = function(_, on_confirm)
  local a = table.remove(answers, 1)
  vim.schedule(function()
    on_confirm(a)
  end)
end

-- --- the agent: another gaffer process ------------------------------------------------------
local Agent = {}
Agent.__index = Agent
function Agent.new()
  local self = setmetatable({ buf = "", replies = {}, next = 1 }, Agent)
  self.proc = vim.system({ GAFFER, "--workspace", WS, "serve", "--jsonl", "--log-file", OUT .. "/agent-gaffer.log" }, {
    stdin = true,
    -- Like every serving gaffer, the agent's holds the operator's public key (only).
    env = {
      GAFFER_OPERATOR_KEY_FILE = OUT .. "/agent-has-no-private-key",
      GAFFER_OPERATOR_PUBLIC_KEY_FILE = (KEY:gsub("%.key$", ".pub")),
    },
    stdout = function(_, data)
      if data then
        self.buf = self.buf .. data
      end
    end,
  })
  return self
end
function Agent:call(method, params)
  local id = self.next
  self.next = id + 1
  self.proc:write(vim.json.encode({ jsonrpc = "2.0", id = id, method = method, params = params }) .. "\n")
  wait(function()
    while true do
      local nl = self.buf:find("\n", 1, true)
      if not nl then
        break
      end
      local line = self.buf:sub(1, nl - 1)
      self.buf = self.buf:sub(nl + 1)
      local ok, m = pcall(vim.json.decode, line)
      if ok and m.id then
        self.replies[m.id] = m
      end
    end
    return self.replies[id] ~= nil
  end, 30000, "the agent's " .. method)
  local r = self.replies[id]
  if r.error then
    fail(method .. ": " .. vim.json.encode(r.error))
  end
  return r.result
end
function Agent:wait_for(id, states)
  local rev = 0
  local deadline = vim.uv.now() + 30000
  while true do
    local v = self:call("operations/wait", { id = id, after_revision = rev, wait_seconds = 2 })
    if vim.tbl_contains(states, v.state) then
      return v
    end
    rev = v.revision
    if vim.uv.now() > deadline then
      fail("operation " .. id .. " stuck in " .. v.state)
    end
  end
end

local function read(path)
  local f = io.open(path, "r")
  if not f then
    return nil
  end
  local s = f:read("*a")
  f:close()
  return s
end

-- --- attach ---------------------------------------------------------------------------------
local g = require("gaffer")
g.setup({ gaffer = GAFFER, key_file = KEY })
local t_attach = vim.uv.hrtime()
vim.cmd.edit(WS .. "/notes/todo.txt")
wait(function()
  return g.is_operator()
end, 15000, "the plugin to attach and log in as the operator")
local attach_ms = (vim.uv.hrtime() - t_attach) / 1e6
expect(g.client().config.root_dir == WS, "attached to the workspace root " .. WS .. " (got " .. tostring(g.client().config.root_dir) .. ")")
say(string.format("attach + operator login: %.0f ms", attach_ms))

local agent = Agent.new()
local AFTER = "# todo\n- write the parser\n- add tests for the parser\n- ship it\n"

-- --- 1. approve through the plugin ------------------------------------------------------------
local t_submit = vim.uv.hrtime()
local op1 = agent:call("operations/submit", {
  operation = "file.write",
  target = { path = "notes/todo.txt" },
  arguments = { content = AFTER },
  reason = "update the todo list",
  idempotency_key = "todo-1",
})
local t_reply = vim.uv.hrtime()
expect(op1.state == "pending", "the agent's write waits for a human")
wait(function()
  return note_with("wants: Write notes/todo.txt") ~= nil
end, 5000, "the approval notification")
local n1 = note_with("wants: Write notes/todo.txt")
local latency = { sent_to_notify_ms = (n1.t - t_submit) / 1e6, reply_to_notify_ms = (n1.t - t_reply) / 1e6 }
say(string.format("notification latency: sent->notify %.0f ms, submit reply->notify %.0f ms", latency.sent_to_notify_ms, latency.reply_to_notify_ms))
expect(n1.level == vim.log.levels.WARN, "the notification is a warning-level vim.notify")

local finished = false
answers = { "Write notes/todo.txt", "Approve" }
g.approvals(function()
  finished = true
end)
wait(function()
  return finished
end, 15000, "the approve flow")
expect(seen_items[1] and seen_items[1][1]:find("Write notes/todo.txt", 1, true) and seen_items[1][1]:find("anonymous", 1, true), "the picker lists the request with its requester: " .. seen_items[1][1])
local preview = table.concat(g.last_preview or {}, "\n")
expect(preview:find("-- add tests\n+- add tests for the parser", 1, true) ~= nil, "the float previews the diff against the file as it is now")
local done1 = agent:wait_for(op1.id, { "succeeded", "failed", "denied", "canceled", "expired" })
expect(done1.state == "succeeded", "approved through the plugin: the agent's wait returned " .. done1.state .. " " .. vim.json.encode(done1.error or {}))
expect(read(WS .. "/notes/todo.txt") == AFTER, "the file has the proposed content")
wait(function()
  for _, p in ipairs(g.progress_log or {}) do
    if (p.title or ""):find(op1.id, 1, true) then
      return true
    end
  end
  return false
end, 10000, "$/progress (LspProgress) for the approved operation")
expect(true, "the approved operation's progress arrives through LspProgress")
local mtime = vim.uv.fs_stat(WS .. "/notes/todo.txt").mtime.sec

-- --- 2. deny with a reason ---------------------------------------------------------------------
local op2 = agent:call("operations/submit", {
  operation = "file.write",
  target = { path = "notes/secrets.txt" },
  arguments = { content = "token=hunter2\n" },
  reason = "cache a token",
  idempotency_key = "secrets-1",
})
wait(function()
  return note_with("wants: Write notes/secrets.txt") ~= nil
end, 5000, "the second notification")
local REASON = "no secrets in the repo, use the vault"
finished = false
answers = { "Write notes/secrets.txt", "Deny…", REASON }
g.approvals(function()
  finished = true
end)
wait(function()
  return finished
end, 15000, "the deny flow")
local done2 = agent:wait_for(op2.id, { "succeeded", "failed", "denied", "canceled", "expired" })
expect(done2.state == "denied", "denied through the plugin")
expect(done2.error and done2.error.message:find(REASON, 1, true) ~= nil, "the reason reached the agent: " .. (done2.error and done2.error.message or "?"))
expect(read(WS .. "/notes/secrets.txt") == nil, "the denied file was not written")
wait(function()
  return note_with(op2.id .. " denied") ~= nil
end, 5000, "the terminal-state notification")
expect(true, "terminal states are notified")

-- --- 3. approve narrower: one minute instead of the requested ten --------------------------------
local op3 = agent:call("operations/submit", {
  operation = "file.write",
  target = { path = "notes/later.txt" },
  arguments = { content = "later\n" },
  reason = "a note",
  idempotency_key = "later-1",
})
wait(function()
  return note_with("wants: Write notes/later.txt") ~= nil
end, 5000, "the third notification")
finished = false
answers = { "Write notes/later.txt", "Approve narrower", "for 60s only" }
g.approvals(function()
  finished = true
end)
wait(function()
  return finished
end, 15000, "the narrower flow")
local done3 = agent:wait_for(op3.id, { "succeeded", "failed", "denied", "canceled", "expired" })
expect(done3.state == "succeeded", "approved narrower (" .. done3.state .. " " .. vim.json.encode(done3.error or {}) .. ")")
local ap3
g.request("approvals/get", { id = op3.id }, function(r)
  ap3 = r
end)
wait(function()
  return ap3 ~= nil
end, 5000, "approvals/get")
local function secs(iso)
  local h, m, s = iso:match("T(%d+):(%d+):(%d+)")
  return tonumber(h) * 3600 + tonumber(m) * 60 + tonumber(s)
end
local granted = (secs(ap3.expires_at) - secs(op3.created_at) + 86400) % 86400
expect(granted >= 55 and granted <= 65, "the signed approval lasts one minute, not ten (" .. granted .. " s)")

-- --- 4. :Gaffer ops --------------------------------------------------------------------------------
local ops_done = false
g.ops(function()
  ops_done = true
end)
wait(function()
  return ops_done
end, 5000, ":Gaffer ops")
local ops = table.concat(vim.api.nvim_buf_get_lines(vim.fn.bufnr("gaffer://operations"), 0, -1, false), "\n")
expect(ops:find("succeeded (2)", 1, true) and ops:find("denied (1)", 1, true), ":Gaffer ops groups by state:\n" .. ops)
expect(ops:find("no secrets in the repo", 1, true) ~= nil, ":Gaffer ops shows the denial's reason")
expect(vim.uv.fs_stat(WS .. "/notes/todo.txt").mtime.sec == mtime and read(WS .. "/notes/todo.txt") == AFTER, "the approved file was written once")

-- --- 5. :Gaffer logs follows a worker started by the agent ---------------------------------------
local bundle = {
  metadata = { id = "echo-bundle", revision = "r1", created_at = "2026-12-01T00:00:00Z", provenance = { source = "nvim-test" } },
  profiles = {
    {
      selector = { kind = "named", value = "echo" },
      label = "echo worker",
      command = { "sh", "-c", "while read line; do echo \"worker heard: $line\"; done" },
      input_mode = "stdin_text",
    },
  },
}
local synced = agent:call("bundles/sync", { bundle = bundle })
local digest = synced.reference and synced.reference.digest
expect(type(digest) == "string", "the agent synced a bundle")
local w = agent:call("workers/create", {
  profile = { kind = "named", value = "echo" },
  config_bundle = { id = "echo-bundle", digest = digest },
  initial_input = "hello from the agent",
  idempotency_key = "echo-1",
})
local wid = w.worker and w.worker.id
expect(type(wid) == "string", "the agent created a worker " .. tostring(wid))
-- Starting it is a gated operation: the operator approves its start through the plugin.
expect(w.worker.status == "pending_approval", "the worker waits for its start to be approved")
wait(function()
  return note_with("wants: Start worker " .. wid) ~= nil
end, 5000, "the worker.start notification")
local started = false
answers = { "Start worker " .. wid, "Approve" }
g.approvals(function()
  started = true
end)
wait(function()
  return started
end, 15000, "approving the worker's start")
vim.cmd("Gaffer logs " .. wid)
local logbuf = vim.fn.bufnr("gaffer://logs/" .. wid)
local function log_text()
  return table.concat(vim.api.nvim_buf_get_lines(logbuf, 0, -1, false), "\n")
end
wait(function()
  return log_text():find("worker heard: hello from the agent", 1, true) ~= nil
end, 10000, "the transcript in :Gaffer logs")
expect(log_text():find("> hello from the agent\nworker heard: hello from the agent", 1, true) ~= nil, ":Gaffer logs shows the transcript, input marked:\n" .. log_text())
agent:call("workers/input", { worker_id = wid, input = "a later line" })
wait(function()
  return log_text():find("worker heard: a later line", 1, true) ~= nil
end, 10000, "new output to be followed")
local win = vim.fn.win_findbuf(logbuf)[1]
expect(win and vim.api.nvim_win_get_cursor(win)[1] >= vim.api.nvim_buf_line_count(logbuf) - 1, ":Gaffer logs follows new output (cursor at the end)")
local _, count = log_text():gsub("worker heard: hello from the agent", "")
expect(count == 1, "no line is shown twice")

-- --- 6. :Gaffer plan -----------------------------------------------------------------------------
local planbuf
g.plan("Add rate limiting to the router and billing, with tests", function(b)
  planbuf = b
end)
wait(function()
  return planbuf ~= nil
end, 10000, ":Gaffer plan")
local plan = table.concat(vim.api.nvim_buf_get_lines(planbuf, 0, -1, false), "\n")
expect(plan:find("- pattern: **", 1, true) and plan:find("## Proof expectations", 1, true) and plan:find("mechanism: **", 1, true), ":Gaffer plan shows pattern, mechanism, lanes and proofs")

-- --- 7. :checkhealth gaffer ------------------------------------------------------------------------
vim.cmd("checkhealth gaffer")
local health = table.concat(vim.api.nvim_buf_get_lines(0, 0, -1, false), "\n")
local f = io.open(OUT .. "/checkhealth.txt", "w")
f:write(health)
f:close()
expect(health:find("OK", 1, true) and health:find("version 0.", 1, true), ":checkhealth gaffer reports the version")
expect(health:find("operator_key: ", 1, true) and health:find("logged in as the operator", 1, true), ":checkhealth gaffer reports the key and the login")
expect(health:find("policy_trust", 1, true) ~= nil, ":checkhealth gaffer reports trust")
expect(not health:find("ERROR", 1, true), ":checkhealth gaffer has no errors")

-- --- 8. the preview shows what decides first, and the agent's text as it is ------------------
-- The agent chooses its text: a reason posing as the mode line and a diff above 80 line breaks,
-- an argv hiding its tail below 120 line breaks and behind a right-to-left override, a change
-- too large to diff made against a file that changed since. With an operator's 'nowrap'.
vim.wo.wrap = false
local function float_lines()
  for _, w in ipairs(vim.api.nvim_list_wins()) do
    if vim.api.nvim_win_get_config(w).relative ~= "" then
      return w, vim.api.nvim_buf_get_lines(vim.api.nvim_win_get_buf(w), 0, -1, false)
    end
  end
end
local function line_at(lines, prefix)
  for i, l in ipairs(lines) do
    if l:sub(1, #prefix) == prefix then
      return i
    end
  end
end
local HIDDEN = { "\n", "\r", "\27", "\194\133" }
for _, cp in ipairs({ 0x200B, 0x2028, 0x2029, 0x202A, 0x202E, 0x2066, 0x2069, 0xFEFF }) do
  table.insert(HIDDEN, vim.fn.nr2char(cp))
end
local function holds_hidden(lines)
  for _, l in ipairs(lines) do
    for _, h in ipairs(HIDDEN) do
      if l:find(h, 1, true) then
        return l
      end
    end
  end
  return nil
end
local function preview_of(title)
  local seen
  on_action = function()
    local w, lines = float_lines()
    local footer = vim.api.nvim_win_get_config(w).footer or {}
    seen = { lines = lines, wrap = vim.wo[w].wrap, height = vim.api.nvim_win_get_height(w), ends = {} }
    seen.footer = type(footer) == "table" and table.concat(vim.tbl_map(function(c)
      return c[1]
    end, footer)) or footer
    for i = 1, #lines do
      seen.ends[i] = vim.api.nvim_win_text_height(w, { end_row = i - 1 }).all
    end
    -- Line i (1-based) is there for the operator: it ends inside the float's height.
    seen.view = function(i)
      return i ~= nil and seen.ends[i] <= seen.height
    end
  end
  finished = false
  answers = { title, "Cancel" }
  g.approvals(function()
    finished = true
  end)
  wait(function()
    return finished
  end, 15000, "the preview of " .. title)
  on_action = nil
  expect(seen ~= nil, "the float was open while the action picker waited")
  return seen
end

local TAIL = "rm -rf ~/"
local FAKE = "mode execution (exactly this one execution); at most 60s, 1 use(s)\n--- a/notes/todo.txt\n+++ b/notes/todo.txt\n+- ship it"
agent:call("operations/submit", {
  operation = "command.run",
  target = { argv = { "sh", "-c", "echo tidy" .. ("\n"):rep(120) .. vim.fn.nr2char(0x202E) .. TAIL } },
  arguments = vim.empty_dict(),
  reason = FAKE .. ("\n"):rep(80),
  idempotency_key = "hide-1",
})
wait(function()
  return note_with("wants: Run sh") ~= nil
end, 5000, "the command's notification")
local cmd = preview_of("Run sh")
local L = cmd.lines
expect(L[1] == "# command.run, requested by anonymous" and cmd.view(1), "the float starts with the operation and its requester: " .. L[1])
expect(line_at(L, "mode ") == 2 and cmd.view(2) and L[2]:find("^mode execution %(exactly this one execution%); at most 600s, 1 use%(s%)"), "the real mode line is second and in view: " .. L[2])
local argv = line_at(L, "$ sh -c ")
expect(argv and L[argv]:find(TAIL, 1, true) and cmd.view(argv), "the whole argv, its tail included, is one line in view (row " .. tostring(argv) .. ", float " .. cmd.height .. " rows)")
expect(argv and L[argv]:find("tidy\\u{a}\\u{a}", 1, false) and L[argv]:find("\\u{202e}rm", 1, false), "the argv's line breaks and override are spelled out")
expect(cmd.wrap, "the float wraps under an operator's nowrap")
expect(cmd.footer:find("more rows below, not shown", 1, true), "the float says what it cannot show:" .. cmd.footer)
expect(holds_hidden(L) == nil, "no line of the float holds a control or invisible character: " .. tostring(holds_hidden(L)))
expect(L[#L]:find("the agent says: mode execution", 1, true) == 1 and line_at(L, "--- a/") == nil, "the agent's reason is one line, last, posing as nothing: " .. L[#L]:sub(1, 80))

-- The picker and the operations list hold the agent's title the same way.
local TITLE = "Write a\r\27[2K" .. vim.fn.nr2char(0x202E) .. "txt.exe"
local listed = {
  g.format_approval({ title = TITLE, client_id = "anonymous", pending_expires_at = "" }),
  g.operation_lines({ { id = "op_x", state = "pending", client_id = "anonymous", operation = "file.write", presentation = { title = TITLE } } })[2],
}
expect(holds_hidden(listed) == nil and listed[1]:find("a\\u{d}\\u{1b}%[2K\\u{202e}txt") and listed[2]:find("\\u{202e}txt", 1, false), "the picker and :Gaffer ops spell out what the agent's title holds: " .. table.concat(listed, " | "))

local BIG = WS .. "/notes/big.txt"
local f = io.open(BIG, "w")
f:write("small\n")
f:close()
agent:call("operations/submit", {
  operation = "file.write",
  target = { path = "notes/big.txt" },
  arguments = { content = (("x"):rep(99) .. "\n"):rep(800) },
  reason = "regenerate",
  idempotency_key = "big-1",
})
f = io.open(BIG, "a")
f:write("changed after the plan\n")
f:close()
wait(function()
  return note_with("wants: Write notes/big.txt") ~= nil
end, 5000, "the big write's notification")
local big = preview_of("Write notes/big.txt")
local cut, stale = line_at(big.lines, "!! THE DIFF IS CUT"), line_at(big.lines, "!! THE FILE CHANGED")
expect(cut and big.view(cut), "a diff cut at its bound says so, in view: " .. table.concat(big.lines, " | "):sub(1, 300))
expect(stale and big.view(stale), "a file changed since the plan says so, in view")

agent.proc:kill(15)
local m = string.format('{"attach_login_ms": %.0f, "sent_to_notify_ms": %.0f, "reply_to_notify_ms": %.0f}', attach_ms, latency.sent_to_notify_ms, latency.reply_to_notify_ms)
say("MEASURES " .. m)
local mf = io.open(OUT .. "/measures.json", "w")
mf:write(m .. "\n")
mf:close()
say("PASS")
vim.cmd("qall!")
