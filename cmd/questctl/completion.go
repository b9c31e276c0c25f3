package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// command is one command of questctl's table: its name, one word or two
// ("bench attention"), a one-line summary for shell completion, and the
// function that builds its flags and action without running it.
type command struct {
	name    string
	summary string
	build   func() (*flag.FlagSet, action)
}

// commands is the table of questctl's commands with their flags, the
// source of the shell completion scripts (and of the tests that check
// every command's conventions). Internal commands ('bench collective
// rank') are not listed.
func commands() []command {
	return []command{
		{"demo", "synthetic long context decoded with Quest and dense side by side", demoCommand},
		{"replay", "run one saved request and print the result JSON", replayCommand},
		{"replay gen", "write a generated replay case", replayGenCommand},
		{"bench attention", "one-layer Quest vs dense attention benchmark", benchAttentionCommand},
		{"bench collective", "latency of the CP selection exchange and merge", benchCollectiveCommand},
		{"bench decode", "whole-model decode tokens/s on the GPU, Quest and dense (random weights or a checkpoint)", benchDecodeCommand},
		{"bench offload", "offload: step time, hit rate and bytes moved vs the all-resident step", benchOffloadCommand},
		{"bench selection", "exact vs union vs replicated CP selection", benchSelectionCommand},
		{"bench serve", "completions API load test: TTFT, inter-token latency, tokens/s, passkey accuracy", benchServeCommand},
		{"devices", "the node's NVIDIA GPUs (NVML)", devicesCommand},
		{"generate", "decode a Llama checkpoint through the engine", generateCommand},
		{"eval passkey", "passkey accuracy and recall vs dense", evalPasskeyCommand},
		{"calibrate", "per-layer budgets reaching a target attention-mass recall", calibrateCommand},
		{"plot", "PNG figure of eval passkey or bench attention JSON lines", plotCommand},
		{"up", "start a local questd cluster until Ctrl-C", func() (*flag.FlagSet, action) { return upCommand(nil) }},
		{"status", "one questd's view of the cluster", statusCommand},
		{"tls ca", "a CA for a cluster's mutual TLS (ca.pem, ca.key)", tlsCACommand},
		{"tls node", "a node's certificate (questrt://node/NAME)", tlsLeafCommand("node", "")},
		{"tls client", "a client's certificate (questrt://client/NAME)", tlsLeafCommand("client", "")},
		{"replay-request", "re-run a served request with dense attention: where Quest and dense diverge", func() (*flag.FlagSet, action) { return replayRequestCommand("") }},
		{"version", "the version and VCS revision of this build", versionCommand},
		{"completion bash", "bash completion script", completionCommand("bash")},
		{"completion zsh", "zsh completion script", completionCommand("zsh")},
		{"completion fish", "fish completion script", completionCommand("fish")},
	}
}

// groupSummaries describe the first words of two-word commands that are
// no command of their own.
var groupSummaries = map[string]string{
	"bench":      "benchmarks: attention, collective, decode, offload, selection or serve",
	"eval":       "quality evaluations: passkey",
	"completion": "shell completion script: bash, zsh or fish",
	"tls":        "certificates for mutual TLS: ca, node or client",
}

// shells are the shells 'questctl completion' writes scripts for.
var shells = []string{"bash", "zsh", "fish"}

const completionUsage = `Usage: questctl completion bash|zsh|fish

Prints a completion script for the shell: it completes questctl's
commands, their subcommands (bench attention|collective|decode|offload|selection|serve, eval
passkey, replay gen, tls ca|node|client) and each command's flags, with the values of flags
that take one of a few (--kv-cache-dtype). Run 'questctl completion SHELL
--help' for how to load it.
`

// completionHelp says how to load each shell's script.
var completionHelp = map[string]string{
	"bash": `Load it in the current shell (bash 4.1 or later):

  source <(questctl completion bash)

or for every session, with the bash-completion package installed:

  questctl completion bash > ~/.local/share/bash-completion/completions/questctl`,
	"zsh": `Load it in the current shell, after compinit:

  source <(questctl completion zsh)

or for every session, as _questctl in a directory of $fpath:

  questctl completion zsh > "${fpath[1]}/_questctl"   # then start a new shell`,
	"fish": `Load it in the current shell:

  questctl completion fish | source

or for every session:

  questctl completion fish > ~/.config/fish/completions/questctl.fish`,
}

// runCompletion is 'questctl completion SHELL'.
func runCompletion(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return usageError{errors.New("want a shell: bash, zsh or fish (see 'questctl completion --help')")}
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, completionUsage)
		return nil
	}
	if !slices.Contains(shells, args[0]) {
		return usageError{fmt.Errorf("unknown shell %q (want bash, zsh or fish)", args[0])}
	}
	return runCommand(context.Background(), completionCommand(args[0]), args[1:], stdout, stderr)
}

// completionCommand returns the builder of 'questctl completion SHELL'.
func completionCommand(shell string) func() (*flag.FlagSet, action) {
	return func() (*flag.FlagSet, action) {
		fs := newFlags("completion "+shell, fmt.Sprintf(`Usage: questctl completion %s

Prints the %s completion script of questctl on stdout: commands,
subcommands and every command's flags, made from the commands' own flag
definitions.

%s`, shell, shell, completionHelp[shell]))
		return fs, func(_ context.Context, stdout, _ io.Writer) error {
			_, err := io.WriteString(stdout, completionScript(shell))
			return err
		}
	}
}

// compFlag is one flag as completion offers it.
type compFlag struct {
	name    string
	usage   string   // its help, shortened
	value   bool     // takes a value (not a bool flag)
	choices []string // the values to offer, if the flag's Value lists them
	group   []string // the names that set the same flag (aliases), itself included
}

// compCmd is one command (one or two words) as completion offers it.
type compCmd struct {
	name    string
	summary string
	flags   []compFlag
}

// compTop is a first word: a command, a group of commands, or both
// (replay and replay gen).
type compTop struct {
	word    string
	summary string
	subs    []compCmd // two-word commands under word
}

// completionModel builds every command's flag set (nothing runs) and
// returns the commands and the first words in table order.
func completionModel() ([]compCmd, []compTop) {
	var cmds []compCmd
	var tops []compTop
	top := func(word string) *compTop {
		for i := range tops {
			if tops[i].word == word {
				return &tops[i]
			}
		}
		tops = append(tops, compTop{word: word, summary: groupSummaries[word]})
		return &tops[len(tops)-1]
	}
	for _, c := range commands() {
		fs, _ := c.build()
		cc := compCmd{name: c.name, summary: c.summary, flags: compFlags(fs)}
		cmds = append(cmds, cc)
		first, sub, two := strings.Cut(c.name, " ")
		t := top(first)
		if two {
			cc.name = sub
			t.subs = append(t.subs, cc)
		} else {
			t.summary = c.summary
		}
	}
	tops = append(tops, compTop{word: "help", summary: "the commands and what they do"})
	return cmds, tops
}

// compFlags lists fs's flags in name order, and --help.
func compFlags(fs *flag.FlagSet) []compFlag {
	groups := map[string][]string{} // canonical name -> names
	fs.VisitAll(func(f *flag.Flag) {
		canon := f.Name
		if a, ok := f.Value.(*aliasValue); ok {
			canon = a.canonical
		}
		groups[canon] = append(groups[canon], f.Name)
	})
	var out []compFlag
	fs.VisitAll(func(f *flag.Flag) {
		cf := compFlag{name: f.Name, usage: shortUsage(f), value: true}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			cf.value = false
		}
		if c, ok := valueOf(f).(interface{ Choices() []string }); ok {
			cf.choices = c.Choices()
		}
		canon := f.Name
		if a, ok := f.Value.(*aliasValue); ok {
			canon = a.canonical
		}
		if g := groups[canon]; len(g) > 1 {
			cf.group = g
		}
		out = append(out, cf)
	})
	return append(out, compFlag{name: "help", usage: "print the command's usage and flags"})
}

// shortUsage is the first clause of f's help, without back quotes, for
// the descriptions of zsh and fish.
func shortUsage(f *flag.Flag) string {
	_, u := flag.UnquoteUsage(f)
	if i := strings.Index(u, "; "); i > 0 {
		u = u[:i]
	}
	if i := strings.Index(u, " ("); i > 0 {
		u = u[:i]
	}
	if len(u) > 70 {
		u = u[:70]
		if i := strings.LastIndexByte(u, ' '); i > 40 {
			u = u[:i]
		}
		u += "..."
	}
	return u
}

// completionScript is the completion script of shell.
func completionScript(shell string) string {
	cmds, tops := completionModel()
	switch shell {
	case "bash":
		return bashCompletion(cmds, tops)
	case "zsh":
		return zshCompletion(cmds, tops)
	}
	return fishCompletion(cmds, tops)
}

// flagNames returns "--name" for every flag (valued only: those taking a
// value), space-separated.
func flagNames(fl []compFlag, valued bool) string {
	var b []string
	for _, f := range fl {
		if !valued || f.value {
			b = append(b, "--"+f.name)
		}
	}
	return strings.Join(b, " ")
}

// subCases is the case pattern of every two-word command: 'bench
// attention'|'replay gen'|...
func subCases(tops []compTop) string {
	var b []string
	for _, t := range tops {
		for _, s := range t.subs {
			b = append(b, "'"+t.word+" "+s.name+"'")
		}
	}
	return strings.Join(b, "|")
}

func bashCompletion(cmds []compCmd, tops []compTop) string {
	var b strings.Builder
	b.WriteString(`# bash completion for questctl, generated by 'questctl completion bash'.
# Load it with: source <(questctl completion bash)

_questctl() {
    local cur prev cmd flags valued i
    COMPREPLY=()
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    if (( COMP_CWORD == 1 )); then
`)
	var words []string
	for _, t := range tops {
		words = append(words, t.word)
	}
	fmt.Fprintf(&b, "        COMPREPLY=($(compgen -W '%s' -- \"$cur\"))\n        return\n    fi\n", strings.Join(words, " "))
	b.WriteString("    cmd=${COMP_WORDS[1]}\n    if (( COMP_CWORD == 2 )) && [[ $cur != -* ]]; then\n        case $cmd in\n")
	for _, t := range tops {
		if len(t.subs) == 0 {
			continue
		}
		var subs []string
		for _, s := range t.subs {
			subs = append(subs, s.name)
		}
		fmt.Fprintf(&b, "        %s) COMPREPLY=($(compgen -W '%s' -- \"$cur\")); return ;;\n", t.word, strings.Join(subs, " "))
	}
	fmt.Fprintf(&b, `        esac
    fi
    if (( COMP_CWORD > 2 )); then
        case "$cmd ${COMP_WORDS[2]}" in
        %s) cmd="$cmd ${COMP_WORDS[2]}" ;;
        esac
    fi
    # After "--" (questctl up passes the rest to questd): files.
    for ((i = 2; i < COMP_CWORD; i++)); do
        if [[ ${COMP_WORDS[i]} == -- ]]; then
            compopt -o default 2>/dev/null
            return
        fi
    done
    case $cmd in
`, subCases(tops))
	for _, c := range cmds {
		fmt.Fprintf(&b, "    '%s')\n        flags='%s'\n        valued='%s'\n        ;;\n", c.name, flagNames(c.flags, false), flagNames(c.flags, true))
	}
	b.WriteString("    *) return ;;\n    esac\n")
	b.WriteString("    if [[ \" $valued \" == *\" $prev \"* ]]; then\n        case \"$cmd $prev\" in\n")
	for _, c := range cmds {
		for _, f := range c.flags {
			if len(f.choices) > 0 {
				fmt.Fprintf(&b, "        '%s --%s') COMPREPLY=($(compgen -W '%s' -- \"$cur\")) ;;\n", c.name, f.name, strings.Join(f.choices, " "))
			}
		}
	}
	b.WriteString(`        *) compopt -o default 2>/dev/null ;;
        esac
        return
    fi
    COMPREPLY=($(compgen -W "$flags" -- "$cur"))
}

complete -F _questctl questctl
`)
	return b.String()
}

// zshQuote quotes s for a single-quoted zsh word.
func zshQuote(s string) string { return strings.ReplaceAll(s, "'", `'\''`) }

// zshDesc escapes s for the brackets of an _arguments spec and the
// descriptions of _describe.
func zshDesc(s string) string {
	return zshQuote(strings.NewReplacer(`\`, `\\`, "[", `\[`, "]", `\]`, ":", `\:`).Replace(s))
}

func zshCompletion(cmds []compCmd, tops []compTop) string {
	var b strings.Builder
	b.WriteString(`#compdef questctl
# zsh completion for questctl, generated by 'questctl completion zsh'.
# Load it with: source <(questctl completion zsh) (after compinit), or
# save it as _questctl in a directory of $fpath.

_questctl() {
    local cmd n=2
    local -a cmds subs
    if (( CURRENT == 2 )); then
        cmds=(
`)
	for _, t := range tops {
		fmt.Fprintf(&b, "            '%s:%s'\n", t.word, zshDesc(t.summary))
	}
	b.WriteString("        )\n        _describe -t commands 'questctl command' cmds\n        return\n    fi\n    cmd=${words[2]}\n    case $cmd in\n")
	for _, t := range tops {
		if len(t.subs) == 0 {
			continue
		}
		fmt.Fprintf(&b, "    (%s) subs=(", t.word)
		for i, s := range t.subs {
			if i > 0 {
				b.WriteString(" ")
			}
			fmt.Fprintf(&b, "'%s:%s'", s.name, zshDesc(s.summary))
		}
		b.WriteString(") ;;\n")
	}
	fmt.Fprintf(&b, `    esac
    if (( CURRENT == 3 && ${#subs} )) && [[ ${words[3]} != -* ]]; then
        _describe -t commands "questctl $cmd command" subs
        return
    fi
    if (( CURRENT > 3 )); then
        case "$cmd ${words[3]}" in
        (%s) cmd="$cmd ${words[3]}"; n=3 ;;
        esac
    fi
    words=("${(@)words[n,-1]}")
    (( CURRENT -= n - 1 ))
    case $cmd in
`, subCases(tops))
	for _, c := range cmds {
		fmt.Fprintf(&b, "    ('%s')\n        _arguments :", c.name)
		for _, f := range c.flags {
			b.WriteString(" \\\n            '")
			if len(f.group) > 0 {
				var ex []string
				for _, g := range f.group {
					ex = append(ex, "--"+g)
				}
				fmt.Fprintf(&b, "(%s)", strings.Join(ex, " "))
			}
			fmt.Fprintf(&b, "--%s", f.name)
			if f.value {
				b.WriteString("=")
			}
			fmt.Fprintf(&b, "[%s]", zshDesc(f.usage))
			switch {
			case len(f.choices) > 0:
				fmt.Fprintf(&b, ":%s:(%s)", f.name, strings.Join(f.choices, " "))
			case f.value:
				fmt.Fprintf(&b, ":%s:_default", f.name)
			}
			b.WriteString("'")
		}
		b.WriteString("\n        ;;\n")
	}
	b.WriteString(`    esac
}

if [[ $funcstack[1] == _questctl ]]; then
    _questctl "$@"
else
    compdef _questctl questctl
fi
`)
	return b.String()
}

// fishQuote quotes s as a single-quoted fish word.
func fishQuote(s string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, "'", `\'`).Replace(s) + "'"
}

func fishCompletion(cmds []compCmd, tops []compTop) string {
	var b strings.Builder
	b.WriteString(`# fish completion for questctl, generated by 'questctl completion fish'.
# Load it with: questctl completion fish | source

# __questctl_command prints the command being completed: its first word,
# or both words of a two-word command (bench attention).
function __questctl_command
    set -l words (commandline -opc)
    set -q words[2]; or return 1
    set -l cmd $words[2]
    if set -q words[3]
        switch "$cmd $words[3]"
            case `)
	var subs []string
	for _, t := range tops {
		for _, s := range t.subs {
			subs = append(subs, fishQuote(t.word+" "+s.name))
		}
	}
	b.WriteString(strings.Join(subs, " "))
	b.WriteString(`
                set cmd "$cmd $words[3]"
        end
    end
    echo $cmd
end

# __questctl_using CMD: the command being completed is CMD.
function __questctl_using
    set -l cmd (__questctl_command)
    test "$cmd" = "$argv[1]"
end

# __questctl_sub CMD: completing the word right after command CMD.
function __questctl_sub
    set -l words (commandline -opc)
    test (count $words) -eq 2; and test "$words[2]" = "$argv[1]"
end

complete -c questctl -f
`)
	for _, t := range tops {
		fmt.Fprintf(&b, "complete -c questctl -n 'test (count (commandline -opc)) -eq 1' -a %s -d %s\n", t.word, fishQuote(t.summary))
	}
	for _, t := range tops {
		for _, s := range t.subs {
			fmt.Fprintf(&b, "complete -c questctl -n '__questctl_sub %s' -a %s -d %s\n", t.word, s.name, fishQuote(s.summary))
		}
	}
	for _, c := range cmds {
		for _, f := range c.flags {
			fmt.Fprintf(&b, "complete -c questctl -n %s -l %s", fishQuote("__questctl_using '"+c.name+"'"), f.name)
			switch {
			case len(f.choices) > 0:
				fmt.Fprintf(&b, " -x -a %s", fishQuote(strings.Join(f.choices, " ")))
			case f.value:
				b.WriteString(" -r -F")
			}
			fmt.Fprintf(&b, " -d %s\n", fishQuote(f.usage))
		}
	}
	return b.String()
}
