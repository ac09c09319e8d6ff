# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_hub_sidecar_global_optspecs
    string join \n c/config= agent-id= token= hub-url= state-dir= repo-dir= metrics-addr= log-format= log-level= h/help V/version
end

function __fish_hub_sidecar_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_hub_sidecar_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_hub_sidecar_using_subcommand
    set -l cmd (__fish_hub_sidecar_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -s h -l help -d 'Print help'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -s V -l version -d 'Print version'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "run" -d 'Run the daemon (the default): connect to the hub, take tasks, report results'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "check" -d 'Validate the config and probe the hub, claude, Ollama, git and the directories'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "run-task" -d 'Run one task offline (no hub): executor, checks, corrective retries; print the result'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "verify" -d 'Run only a task\'s verification steps against a workspace and print the report JSON'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "demo" -d 'Run the real daemon against an embedded mock hub with a sample task, and print the result'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "tasks" -d 'List recent tasks from the flight records: when, executor, duration, attempts, status, cost. Reads only files; works whether the daemon runs or not'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "show" -d 'Tell one task\'s story from its flight record: each attempt\'s prompt, what changed, which checks failed, why the loop stopped, the result and its acknowledgement'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "status" -d 'Ask the running daemon (on its loopback metrics_addr) for the link state, the current task and attempt, and today\'s spend against the daily budget'
complete -c hub-sidecar -n "__fish_hub_sidecar_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand check" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -s w -l workspace -d 'Run in this directory (default: a new temporary directory, kept and printed)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -s o -l out -d 'Write the result frame here instead of stdout' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -s c -l config -d 'Config for executor, verification and env settings (defaults otherwise; the hub keys are not needed)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand run-task" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -s w -l workspace -d 'The directory the checks run in' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -s c -l config -d 'Optional config for [verification] and [env] settings (defaults otherwise)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -l base -d 'What `llm_judge` sees as "changed" in a git work tree: the work since this revision (its commits and what is uncommitted). Default: the merge base of HEAD with the default branch (origin\'s HEAD, else main or master), so a task branch\'s committed work is judged. The base used is printed on stderr' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand verify" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand demo" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand demo" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand demo" -l keep -d 'Keep the demo\'s temporary directory and print where it is'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand demo" -s h -l help -d 'Print help'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -s n -l limit -d 'How many tasks to list, newest first' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -l json -d 'Print JSON (one array) instead of a table'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand tasks" -s h -l help -d 'Print help'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -l json -d 'Print the whole story as JSON (for tools) instead of the timeline'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -s v -l verbose -d 'Also print each attempt\'s prompt and recorded output in full'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand show" -s h -l help -d 'Print help'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -s c -l config -d 'Config file: TOML, or the Node sidecar\'s config.json' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l agent-id -d 'Agent id at the hub (overrides the file and HUB_SIDECAR_AGENT_ID)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l token -d 'Hub token. Prefer the file or HUB_SIDECAR_TOKEN: flags show up in `ps`' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l hub-url -d 'Hub WebSocket URL, e.g. ws://hub:4000/ws' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l state-dir -d 'State directory (state file, workspaces)' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l repo-dir -d 'Workspace for tasks without a repository' -r -F
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l metrics-addr -d 'Serve /healthz and /metrics here, e.g. 127.0.0.1:9464' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l log-format -d 'Log format: `text` for people, `json` for journald/collectors' -r -f -a "text\t''
json\t''"
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l log-level -d 'Log level (RUST_LOG, when set, wins)' -r
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -l json -d 'Print the daemon\'s JSON answer as is'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand status" -s h -l help -d 'Print help'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "run" -d 'Run the daemon (the default): connect to the hub, take tasks, report results'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "check" -d 'Validate the config and probe the hub, claude, Ollama, git and the directories'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "run-task" -d 'Run one task offline (no hub): executor, checks, corrective retries; print the result'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "verify" -d 'Run only a task\'s verification steps against a workspace and print the report JSON'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "demo" -d 'Run the real daemon against an embedded mock hub with a sample task, and print the result'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "tasks" -d 'List recent tasks from the flight records: when, executor, duration, attempts, status, cost. Reads only files; works whether the daemon runs or not'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "show" -d 'Tell one task\'s story from its flight record: each attempt\'s prompt, what changed, which checks failed, why the loop stopped, the result and its acknowledgement'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "status" -d 'Ask the running daemon (on its loopback metrics_addr) for the link state, the current task and attempt, and today\'s spend against the daily budget'
complete -c hub-sidecar -n "__fish_hub_sidecar_using_subcommand help; and not __fish_seen_subcommand_from run check run-task verify demo tasks show status help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
