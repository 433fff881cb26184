-- :checkhealth gaffer — binary, version, operator key, trust, sandbox.
local M = {}

local function run(args)
  local g = require("gaffer")
  local env = nil
  if g.config.key_file then
    env = { GAFFER_OPERATOR_KEY_FILE = vim.fs.normalize(g.config.key_file) }
  end
  local ok, r = pcall(function()
    return vim.system(args, { text = true, env = env, cwd = vim.fn.getcwd() }):wait(10000)
  end)
  if not ok then
    return { code = -1, stdout = "", stderr = tostring(r) }
  end
  return r
end

function M.check()
  local g = require("gaffer")
  local bin = g.config.gaffer
  vim.health.start("gaffer: binary")
  if vim.fn.executable(bin) ~= 1 then
    vim.health.error(bin .. " is not executable", { "cargo install --path . in the gaffer repository", "or setup({ gaffer = '/path/to/gaffer' })" })
    return
  end
  vim.health.ok("found " .. vim.fn.exepath(bin))
  local v = run({ bin, "--version" })
  local version = v.code == 0 and vim.trim(v.stdout):match("(%d+%.%d+%.%d+)") or nil
  if not version then
    vim.health.error("`" .. bin .. " --version` failed: " .. vim.trim(v.stderr or ""))
    return
  end
  local maj, min = version:match("^(%d+)%.(%d+)")
  if tonumber(maj) == 0 and tonumber(min) < 1 then
    vim.health.error("gaffer " .. version .. " is too old (need 0.1.0 or newer)")
  else
    vim.health.ok("version " .. version)
  end

  vim.health.start("gaffer: operator key and trust")
  local d = run({ bin, "--workspace", vim.fn.getcwd(), "doctor" })
  local ok, report = pcall(vim.json.decode, d.stdout or "")
  if not ok or type(report) ~= "table" or type(report.checks) ~= "table" then
    vim.health.error("`gaffer doctor` did not answer: " .. vim.trim(d.stderr or ""))
    return
  end
  local seen_sandbox = false
  for _, c in ipairs(report.checks) do
    local detail = c.detail
    if type(detail) == "string" and detail:sub(1, 1) == "{" then
      local okj, t = pcall(vim.json.decode, detail)
      if okj then
        detail = t
      end
    end
    if type(detail) == "table" then
      detail = detail.exists == false and "no store yet"
        or string.format("%s records, %s", tostring(detail.records or "?"), detail.ok and "verified" or "problems found")
    end
    local line = string.format("%s: %s", c.name, tostring(detail or ""))
    if c.name == "sandbox" then
      seen_sandbox = true
    end
    if c.ok then
      vim.health.ok(line)
    elseif c.name == "operator_key" then
      vim.health.error(line, { "gaffer operator init", "or setup({ key_file = ... })" })
    else
      vim.health.warn(line)
    end
  end
  vim.health.start("gaffer: sandbox")
  if not seen_sandbox then
    vim.health.info("this gaffer reports no sandbox check; workers run with a cleared environment in the workspace root")
  end
  vim.health.start("gaffer: connection")
  local c = g.client()
  if not c then
    vim.health.warn("no gaffer client attached here (open a file under a root with .git or .gaffer)")
  elseif g.is_operator(c) then
    vim.health.ok("attached (client " .. c.id .. ") and logged in as the operator")
  else
    vim.health.warn("attached but not logged in as the operator (is the operator key readable?)")
  end
end

return M
