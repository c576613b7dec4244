package httpretry_test

import (
	"os"
	"strings"
	"testing"
)

// TestReadmeProgram: the README's client-and-server program is
// Example_clientAndServer, line for line (its main is the example's body,
// its last comment the example's Output), so the program the README shows
// is the one go test runs.
func TestReadmeProgram(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Skipf("no README beside the package (not the repository): %v", err)
	}
	example, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	section := between(t, string(readme), "## A client and a server", "\n## ")
	program := between(t, section, "func main() {\n", "\n}\n")
	body := between(t, string(example), "func Example_clientAndServer() {\n", "\n}\n")
	body = strings.Replace(body, "// Output: ", "// ", 1)
	if program != body {
		t.Errorf("the README's program differs from Example_clientAndServer:\nREADME:\n%s\nexample:\n%s", program, body)
	}
}

// between returns the text of s after the first from, up to the next to.
func between(t *testing.T, s, from, to string) string {
	t.Helper()
	_, after, ok := strings.Cut(s, from)
	if !ok {
		t.Fatalf("no %q", from)
	}
	in, _, ok := strings.Cut(after, to)
	if !ok {
		t.Fatalf("no %q after %q", to, from)
	}
	return in
}
