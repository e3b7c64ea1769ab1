# bash completion for conch(1): commands, their options, option values, and the sandbox ids
# and names (and session ids) of the running daemon for the commands that take them. Installed
# as $datadir/bash-completion/completions/conch.

# The daemon's sandbox ids, then the names of those that have one (ps prints "-" for none).
_conch_sandbox_ids()
{
    local sock=$1 names=$2
    conch ${_conch_remote:+--remote "$_conch_remote"} ps ${sock:+--socket "$sock"} 2>/dev/null |
        awk -v names="$names" 'NR > 1 { print $1; if (names && $2 != "-") print $2 }'
}

# The daemon's stores.
_conch_store_names()
{
    local sock=$1
    conch ${_conch_remote:+--remote "$_conch_remote"} store ${sock:+--socket "$sock"} list 2>/dev/null | awk 'NR > 1 { print $1 }'
}

# The daemon's session ids.
_conch_session_ids()
{
    local sock=$1
    conch ${_conch_remote:+--remote "$_conch_remote"} sessions ${sock:+--socket "$sock"} 2>/dev/null | awk 'NR > 1 { print $1 }'
}

_conch()
{
    local cur prev words cword i
    # -n : keeps "ID:PATH" (conch cp) one word.
    _init_completion -n : 2>/dev/null || {
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    }

    local commands="run doctor serve ps create exec changes diff commit discard snapshot restore
                    fork snapshots store cp network start rm
                    logs shell attach sessions js gc mcp help --help --version"
    # `conch --remote URL --token-file FILE VERB ...`: the options before the verb.
    local first=1 _conch_remote=""
    for ((i = 1; i < cword; i++)); do
        [[ ${words[i]} == --remote ]] && _conch_remote=${words[i+1]}
    done
    while [[ ${words[first]} == --remote || ${words[first]} == --token-file ]] &&
        ((first + 1 < cword)); do
        ((first += 2))
    done
    if [[ $prev == --token-file && $cword -le $first ]]; then
        COMPREPLY=($(compgen -f -- "$cur"))
        return
    fi
    if [[ $prev == --remote && $cword -le $first ]]; then
        return
    fi
    if [[ $cword -eq $first ]]; then
        COMPREPLY=($(compgen -W "$commands --remote --token-file" -- "$cur"))
        return
    fi
    local cmd=${words[first]}

    # Everything after "--" is the sandboxed command's own.
    local i
    for ((i = first + 1; i < cword; i++)); do
        if [[ ${words[i]} == -- ]]; then
            COMPREPLY=($(compgen -c -- "$cur"))
            return
        fi
    done

    case $prev in
        --workspace|--rootfs|--state-dir|--cwd)
            COMPREPLY=($(compgen -d -- "$cur"))
            return ;;
        --socket|--tools|--token-file|--tls-cert|--tls-key)
            COMPREPLY=($(compgen -f -- "$cur"))
            return ;;
        --mode)
            COMPREPLY=($(compgen -W "overlay ro rw" -- "$cur"))
            return ;;
        --net)
            COMPREPLY=($(compgen -W "none allow host" -- "$cur"))
            return ;;
        --allow|--deny|--remote)
            return ;;
        --net-hosts|--pass-socket|--tokens)
            COMPREPLY=($(compgen -f -- "$cur"))
            return ;;
        --env|--timeout|--grace|--max-output|--max-spill|--memory|--pids|--cpu|--tmp-size|\
        --home-size|--disk|--max-message|--pool|--max-sandboxes|--idle-timeout|--name|--mount|--delete|--since|--readonly|--hidden|\
        --max-output-memory|--max-bridge-memory|--max-sandbox-bridge-memory|--max-held|--max-sandbox-held|--max-client-output-memory|\
        --listen|--max-body|--max-sessions|--session-idle|--allow-origin)
            return ;;
    esac

    # The daemon's clients: the --socket given so far, and how many arguments (not options)
    # precede the word being completed.
    local sock="" args=0
    for ((i = first + 1; i < cword; i++)); do
        case ${words[i]} in
            --socket) sock=${words[i+1]}; ((i++)) ;;
            --remote|--token-file) ((i++)) ;;
            --since|--mount) ((i++)) ;;
            -*) ;;
            *) ((args++)) ;;
        esac
    done

    local opts
    case $cmd in
        run)
            opts="--workspace --mode --commit --rootfs --as-root --env --cwd --timeout --grace
                  --max-output --max-spill --memory --pids --cpu --tmp-size --home-size --disk
                  --mount --net --allow --deny --readonly --hidden --pass-socket --tools
                  --no-daemon --socket --state-dir --json --quiet -q
                  --help -h --" ;;
        doctor)
            opts="--json --help -h" ;;
        serve)
            opts="--socket --stdio --state-dir --max-message --pool --max-sandboxes
                  --idle-timeout --max-output-memory --max-bridge-memory
                  --max-sandbox-bridge-memory --max-held --max-sandbox-held
                  --max-client-output-memory --net-hosts --tokens --listen --tls-cert
                  --tls-key --max-connections --help -h" ;;
        mcp)
            opts="--workspace --mode --commit --timeout --max-output --memory --pids --cpu
                  --tmp-size --disk --rootfs --as-root --env --net --allow --deny --readonly
                  --hidden --pass-socket --state-dir --listen --tls-cert --tls-key --socket
                  --max-body --max-sessions --session-idle --allow-origin --help -h" ;;
        ps)
            opts="--socket --remote --token-file --json --help -h" ;;
        create)
            opts="--socket --remote --token-file --json --workspace --name --mode --as-root --env --memory --pids
                  --cpu --tmp-size --disk --idle-timeout --mount --net --allow --deny --readonly
                  --hidden --pass-socket --help -h" ;;
        network)
            opts="--socket --remote --token-file --json --allow --deny --net --log --help -h" ;;
        exec|rm|start)
            # exec takes one sandbox, then "--" and the command.
            if [[ $cmd == exec && $args -ge 1 ]]; then
                COMPREPLY=($(compgen -W "--" -- "$cur"))
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock" names)" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --json --help -h"
            if [[ $cmd == exec ]]; then
                opts="$opts --interactive -i --no-stdin -n --tty -t --env --cwd -w --timeout --detach -d"
            fi ;;
        js)
            if [[ $args -ge 1 ]]; then
                COMPREPLY=($(compgen -W "-e --session --timeout" -- "$cur"))
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock" names)" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --json -e --session --timeout --help -h" ;;
        logs)
            if [[ $args -ge 1 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_session_ids "$sock")" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --follow -f --help -h" ;;
        store)
            # store [options] list|ls|cat|put|rm STORE PATH [FILE]
            if [[ $cur == -* ]]; then
                opts="--socket --remote --token-file --json --help -h"
            elif [[ $args -eq 0 ]]; then
                COMPREPLY=($(compgen -W "list ls cat put rm" -- "$cur"))
                return
            elif [[ $args -eq 1 ]]; then
                COMPREPLY=($(compgen -W "$(_conch_store_names "$sock")" -- "$cur"))
                return
            else
                return
            fi ;;
        snapshot|restore|fork|snapshots)
            if [[ $args -ge 1 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock" names)" -- "$cur"))
                return
            fi
            case $cmd in
                snapshot|fork) opts="--socket --remote --token-file --json --name --force --help -h" ;;
                restore) opts="--socket --remote --token-file --json --force --help -h" ;;
                *) opts="--socket --remote --token-file --json --delete --help -h" ;;
            esac ;;
        changes|diff|commit|discard)
            # Options, then the sandbox, then (but for changes) paths inside it.
            if [[ $args -ge 1 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock" names)" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --json --help -h"
            [[ $cmd == changes || $cmd == diff ]] && opts+=" --since"
            [[ $cmd != discard ]] && opts+=" --mount" ;;
        cp)
            # SRC and DST: a local file, or ID:PATH in a sandbox.
            if [[ $args -ge 2 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                local ids
                ids=$(_conch_sandbox_ids "$sock" names | sed 's/$/:/')
                COMPREPLY=($(compgen -W "$ids" -- "$cur") $(compgen -f -- "$cur"))
                # A sandbox's "ID:" is completed further by hand, not ended with a space.
                if [[ ${#COMPREPLY[@]} -eq 1 && ${COMPREPLY[0]} == *: ]]; then
                    compopt -o nospace 2>/dev/null
                fi
                # readline breaks words at ':': offer what follows the last one of $cur.
                if declare -F __ltrim_colon_completions >/dev/null; then
                    __ltrim_colon_completions "$cur"
                fi
                return
            fi
            opts="--socket --remote --token-file --json --help -h" ;;
        shell)
            # One sandbox, by id or name.
            if [[ $args -ge 1 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock" 1)" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --keep --help -h" ;;
        attach)
            if [[ $args -ge 1 ]]; then
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_session_ids "$sock")" -- "$cur"))
                return
            fi
            opts="--socket --remote --token-file --read-only --help -h" ;;
        sessions)
            opts="--socket --remote --token-file --help -h" ;;
        gc)
            opts="--state-dir --help -h" ;;
        *)
            return ;;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}

complete -F _conch conch
