package deploy

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/sandgate/sandgate/internal/kube"
	"github.com/sandgate/sandgate/test/kubetest"
)

// The chart installs with `helm install` (Helm's ownership checks included) twice, as release
// "sandgate" in two namespaces of 63 characters that differ only at the end, both watching the
// sandbox namespace "sandboxes": no object of one release has the other's name. Then the
// first release's ServiceAccount is asked, through the apiserver's authorizer, for everything
// Sandgate may do and a list of what it may not.
func TestChartInstallsTwiceInLongNamespaces(t *testing.T) {
	helmBin(t)
	cluster := kubetest.Start(t)
	cs, _ := kubetest.Clients(t, cluster.Admin)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kubeconfig := kubetest.WriteKubeconfig(t, cluster.Admin)
	long := strings.Repeat("n", 59)
	namespaces := []string{long + "-one", long + "-two"}
	ensureNamespace(t, ctx, cs, "sandboxes")
	for _, ns := range namespaces {
		require.Len(t, ns, 63)
		ensureNamespace(t, ctx, cs, ns)
		out, errOut, err := helm(t, "install", "sandgate", chartDir, "--namespace", ns, "--kubeconfig", kubeconfig)
		require.NoError(t, err, "helm install in %s:\n%s\n%s", ns, out, errOut)
	}
	vaps, err := cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, vaps.Items, 6, "three policies per release")
	roles, err := cs.RbacV1().Roles("sandboxes").List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	assert.Len(t, roles.Items, 2, "a Role per release in the shared sandbox namespace")

	t.Run("what the ServiceAccount may and may not do", func(t *testing.T) {
		ns := namespaces[0]
		sa := "system:serviceaccount:" + ns + ":sandgate"
		const tpl, sbx = "extensions.agents.x-k8s.io", "agents.x-k8s.io"
		const net, core = "networking.k8s.io", ""
		may := []access{
			{"watch", core, "pods", "", "sandboxes", ""},
			{"list", sbx, "sandboxes", "", "sandboxes", ""},
			{"watch", tpl, "sandboxclaims", "", "sandboxes", ""},
			{"list", tpl, "sandboxwarmpools", "", "sandboxes", ""},
			{"get", tpl, "sandboxtemplates", "", "sandboxes", "coding-agent"},
			{"patch", tpl, "sandboxtemplates", "", "sandboxes", "coding-agent"},
			{"create", net, "networkpolicies", "", "sandboxes", ""},
			{"patch", net, "networkpolicies", "", "sandboxes", "sandgate-template-coding-agent"},
			{"delete", net, "networkpolicies", "", "sandboxes", "sandgate-template-gone"},
			{"create", core, "events", "", "sandboxes", ""},
			{"get", net, "networkpolicies", "", ns, kube.SandgateIngressName},
			{"patch", net, "networkpolicies", "", ns, kube.SandgateIngressName},
			{"create", net, "networkpolicies", "", ns, ""},
			{"create", core, "events", "", ns, ""},
		}
		mayNot := []access{
			{"patch", core, "configmaps", "", ns, "sandgate-policies"},
			{"update", core, "configmaps", "", ns, "sandgate-config"},
			{"get", core, "configmaps", "", ns, "sandgate-config"},
			{"create", core, "configmaps", "", ns, ""},
			{"patch", core, "configmaps", "", ns, "sandgate-template-rules"}, // the rules are the admission policy's own now
			{"get", core, "secrets", "", ns, "sandgate-anthropic"},
			{"list", core, "secrets", "", "sandboxes", ""},
			{"patch", net, "networkpolicies", "", ns, "allow-all"},
			{"delete", net, "networkpolicies", "", ns, kube.SandgateIngressName},
			{"create", core, "pods", "", "sandboxes", ""},
			{"patch", core, "pods", "", "sandboxes", "sb-1"},
			{"patch", core, "pods", "status", "sandboxes", "sb-1"},
			{"create", sbx, "sandboxes", "", "sandboxes", ""},
			{"patch", sbx, "sandboxes", "", "sandboxes", "sb-1"},
			{"patch", sbx, "sandboxes", "status", "sandboxes", "sb-1"},
			{"create", tpl, "sandboxclaims", "", "sandboxes", ""},
			{"patch", tpl, "sandboxclaims", "status", "sandboxes", "task-1"},
			{"create", tpl, "sandboxtemplates", "", "sandboxes", ""},
			{"delete", tpl, "sandboxtemplates", "", "sandboxes", "coding-agent"},
			{"patch", tpl, "sandboxwarmpools", "", "sandboxes", "wp-coding"},
			{"patch", "admissionregistration.k8s.io", "validatingadmissionpolicies", "", "", "sandgate-" + ns + "-identity"},
			{"delete", "admissionregistration.k8s.io", "validatingadmissionpolicybindings", "", "", "sandgate-" + ns + "-identity"},
			{"patch", "apps", "deployments", "", ns, "sandgate"},
			{"create", "rbac.authorization.k8s.io", "roles", "", ns, ""},
			{"bind", "rbac.authorization.k8s.io", "roles", "", "sandboxes", ""},
			{"list", core, "pods", "", "kube-system", ""},
			{"patch", core, "configmaps", "", namespaces[1], "sandgate-template-rules"},
		}
		var table strings.Builder
		for _, want := range []struct {
			allowed bool
			rows    []access
		}{{true, may}, {false, mayNot}} {
			for _, a := range want.rows {
				got := a.allowed(t, ctx, cs, sa, ns)
				assert.Equal(t, want.allowed, got, "%s", a)
				fmt.Fprintf(&table, "%-5v %s\n", got, a)
			}
		}
		t.Logf("can-i as %s:\n%s", sa, table.String())
	})
}

// access is one question for the authorizer.
type access struct{ verb, group, resource, subresource, namespace, name string }

func (a access) String() string {
	res := a.resource
	if a.group != "" {
		res += "." + a.group
	}
	if a.name != "" {
		res += "/" + a.name
	}
	if a.subresource != "" {
		res += "/" + a.subresource
	}
	where := a.namespace
	if where == "" {
		where = "(cluster)"
	}
	return fmt.Sprintf("%s %s in %s", a.verb, res, where)
}

// allowed asks the apiserver whether the ServiceAccount user (of saNS) may do a.
func (a access) allowed(t *testing.T, ctx context.Context, cs kubernetes.Interface, user, saNS string) bool {
	t.Helper()
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + saNS, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: a.namespace, Group: a.group, Resource: a.resource,
			Subresource: a.subresource, Name: a.name, Verb: a.verb},
	}}
	got, err := cs.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
	require.NoError(t, err)
	return got.Status.Allowed
}
