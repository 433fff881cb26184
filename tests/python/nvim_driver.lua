-- Runs inside headless Neovim: loads the README's snippet (GAFFER_SNIPPET) verbatim, opens a
-- file of the workspace so the client attaches, calls :GafferStatus, waits for a pushed
-- notification, stops the client, and writes what happened to GAFFER_RESULT as JSON.
local out = { notifications = {}, printed = {} }
local function finish()
  local f = assert(io.open(os.getenv("GAFFER_RESULT"), "w"))
  f:write(vim.json.encode(out))
  f:close()
  vim.cmd("qa!")
end
local ok, err = pcall(function()
  _G.print = function(...)
    table.insert(out.printed, table.concat(vim.tbl_map(tostring, { ... }), " "))
  end
  vim.notify = function(msg)
    table.insert(out.notifications, msg)
  end
  dofile(os.getenv("GAFFER_SNIPPET"))
  -- Test-only: learn the exit code (configs merge; the snippet's settings stay).
  vim.lsp.config("gaffer", {
    on_exit = function(code)
      out.exit_code = code
    end,
  })
  local ws = os.getenv("GAFFER_WORKSPACE")
  vim.cmd.edit(ws .. "/notes.md")
  out.attached = vim.wait(15000, function()
    local c = vim.lsp.get_clients({ name = "gaffer" })[1]
    return c ~= nil and c.initialized == true
  end, 20)
  vim.cmd("GafferStatus")
  vim.wait(10000, function() return #out.printed > 0 end, 20)
  -- Another process submits an operation; gaffer pushes operations/changed to this client.
  vim.system(vim.split(os.getenv("GAFFER_SUBMIT"), "\31", { plain = true })):wait()
  vim.wait(10000, function() return #out.notifications > 0 end, 20)
  local client = vim.lsp.get_clients({ name = "gaffer" })[1]
  client:stop()
  vim.wait(10000, function() return out.exit_code ~= nil end, 20)
end)
if not ok then
  out.error = tostring(err)
end
finish()
