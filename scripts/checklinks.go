//go:build ignore

// checklinks reports every relative link of the repository's Markdown files (README.md, docs/,
// deploy/) whose file does not exist, or whose #anchor names no heading of that file (GitHub's
// anchors: the heading in lower case, spaces as hyphens, punctuation dropped). Run from the
// repository's root: go run scripts/checklinks.go. Exit status 1 when a link is broken.
package main

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// linkRE matches an inline Markdown link or image, capturing its destination.
var linkRE = regexp.MustCompile(`\]\(([^()\s]+)\)`)

func main() {
	var files []string
	for _, root := range []string{"README.md", "docs", "deploy"} {
		err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(path, ".md") {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, "checklinks:", err)
			os.Exit(1)
		}
	}
	broken := 0
	for _, file := range files {
		for _, problem := range check(file) {
			fmt.Fprintf(os.Stderr, "%s: %s\n", file, problem)
			broken++
		}
	}
	if broken > 0 {
		fmt.Fprintf(os.Stderr, "%d broken relative links in the Markdown files\n", broken)
		os.Exit(1)
	}
}

// check returns one line per broken relative link of the Markdown file.
func check(file string) []string {
	text, err := os.ReadFile(file)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	for _, m := range linkRE.FindAllStringSubmatch(stripCode(string(text)), -1) {
		dest := m[1]
		if strings.Contains(dest, "://") || strings.HasPrefix(dest, "mailto:") {
			continue
		}
		path, anchor, _ := strings.Cut(dest, "#")
		target := file
		if path != "" {
			target = filepath.Join(filepath.Dir(file), path)
			if _, err := os.Stat(target); err != nil {
				problems = append(problems, fmt.Sprintf("link %s: no file %s", dest, target))
				continue
			}
		}
		if anchor == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		anchors, err := headingAnchors(target)
		if err != nil {
			problems = append(problems, fmt.Sprintf("link %s: %v", dest, err))
			continue
		}
		if !anchors[anchor] {
			problems = append(problems, fmt.Sprintf("link %s: no heading #%s in %s", dest, anchor, target))
		}
	}
	return problems
}

// stripCode returns text without its fenced code blocks and inline code spans, whose brackets
// are not links.
func stripCode(text string) string {
	var out []string
	fenced := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		parts := strings.Split(line, "`")
		for i := 1; i < len(parts); i += 2 {
			parts[i] = ""
		}
		out = append(out, strings.Join(parts, "`"))
	}
	return strings.Join(out, "\n")
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown file, numbered
// -1, -2, ... for repeated headings.
func headingAnchors(file string) (map[string]bool, error) {
	text, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", file, err)
	}
	anchors := map[string]bool{}
	seen := map[string]int{}
	fenced := false
	for _, line := range strings.Split(string(text), "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced || !strings.HasPrefix(line, "#") {
			continue
		}
		heading := strings.TrimSpace(strings.TrimLeft(line, "#"))
		slug := slugify(heading)
		if n := seen[slug]; n > 0 {
			anchors[fmt.Sprintf("%s-%d", slug, n)] = true
		} else {
			anchors[slug] = true
		}
		seen[slug]++
	}
	return anchors, nil
}

// slugify turns a heading into its GitHub anchor: lower case, letters, digits, hyphens and
// underscores kept, spaces made hyphens, everything else dropped.
func slugify(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}
