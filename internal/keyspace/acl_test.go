package keyspace_test

import (
	"os"
	"strings"
	"testing"

	"github.com/cacheguard/cacheguard/internal/keyspace"
)

// TestACLDoc: docs/usage.md gives each component's user exactly as
// the code that its tests run under (keyspace.ACLService and its kin).
func TestACLDoc(t *testing.T) {
	b, err := os.ReadFile("../../docs/usage.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	for user, cmds := range map[string]string{"app": keyspace.ACLService, "pgfollow": keyspace.ACLFollower, "ops": keyspace.ACLCommand} {
		if want := "```\n" + keyspace.ACLSetUser(user, "cg", cmds) + "\n```"; !strings.Contains(doc, want) {
			t.Errorf("docs/usage.md does not give the user %s as the code does:\n%s", user, want)
		}
	}
	if !strings.Contains(doc, "`"+keyspace.ACLCluster+"`") {
		t.Errorf("docs/usage.md does not give the Cluster's addition %q", keyspace.ACLCluster)
	}
}
