# bash completion for conch(1): commands, their options, option values, and sandbox ids of a
# running daemon for exec and rm. Installed as
# $datadir/bash-completion/completions/conch.

_conch_sandbox_ids()
{
    local sock=$1
    conch ps ${sock:+--socket "$sock"} 2>/dev/null | awk 'NR > 1 { print $1 }'
}

_conch()
{
    local cur prev words cword
    _init_completion 2>/dev/null || {
        cur=${COMP_WORDS[COMP_CWORD]}
        prev=${COMP_WORDS[COMP_CWORD-1]}
        words=("${COMP_WORDS[@]}")
        cword=$COMP_CWORD
    }

    local commands="run doctor serve mcp ps exec rm gc help --help --version"
    if [[ $cword -eq 1 ]]; then
        COMPREPLY=($(compgen -W "$commands" -- "$cur"))
        return
    fi
    local cmd=${words[1]}

    # Everything after "--" is the sandboxed command's own.
    local i
    for ((i = 2; i < cword; i++)); do
        if [[ ${words[i]} == -- ]]; then
            COMPREPLY=($(compgen -c -- "$cur"))
            return
        fi
    done

    case $prev in
        --workspace|--rootfs|--state-dir|--cwd)
            COMPREPLY=($(compgen -d -- "$cur"))
            return ;;
        --socket)
            COMPREPLY=($(compgen -f -- "$cur"))
            return ;;
        --mode)
            COMPREPLY=($(compgen -W "overlay ro rw" -- "$cur"))
            return ;;
        --env|--timeout|--grace|--max-output|--max-spill|--memory|--pids|--cpu|--tmp-size|\
        --home-size|--disk|--max-message|--pool|--max-sandboxes|--idle-timeout)
            return ;;
    esac

    local opts
    case $cmd in
        run)
            opts="--workspace --mode --commit --rootfs --as-root --env --cwd --timeout --grace
                  --max-output --max-spill --memory --pids --cpu --tmp-size --home-size --disk
                  --json --quiet -q --help -h --" ;;
        doctor)
            opts="--json --help -h" ;;
        serve)
            opts="--socket --stdio --state-dir --max-message --pool --max-sandboxes
                  --idle-timeout --help -h" ;;
        mcp)
            opts="--workspace --mode --commit --timeout --max-output --memory --pids --cpu
                  --tmp-size --disk --rootfs --as-root --env --state-dir --help -h" ;;
        ps)
            opts="--socket" ;;
        exec|rm)
            local sock="" ids=0
            for ((i = 2; i < cword; i++)); do
                if [[ ${words[i]} == --socket ]]; then
                    sock=${words[i+1]}
                    ((i++))
                else
                    ((ids++))
                fi
            done
            # exec takes one id, then "--" and the command.
            if [[ $cmd == exec && $ids -ge 1 ]]; then
                COMPREPLY=($(compgen -W "--" -- "$cur"))
                return
            fi
            if [[ $cur != -* ]]; then
                COMPREPLY=($(compgen -W "$(_conch_sandbox_ids "$sock")" -- "$cur"))
                return
            fi
            opts="--socket" ;;
        gc)
            opts="--state-dir --help -h" ;;
        *)
            return ;;
    esac
    COMPREPLY=($(compgen -W "$opts" -- "$cur"))
}

complete -F _conch conch
