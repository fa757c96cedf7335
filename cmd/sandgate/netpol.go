package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/sandgate/sandgate/internal/config"
	"github.com/sandgate/sandgate/internal/kube"
)

// runNetpol prints (or applies) the NetworkPolicies and SandboxTemplate rules that confine
// sandboxes to Sandgate, or the RBAC rules Sandgate needs.
//
//	sandgate netpol --config FILE                         every template of kubernetes.namespaces, read from the cluster
//	sandgate netpol --template NS/NAME                    one template, read from the cluster
//	sandgate netpol --template NS/NAME --management M     one template, offline
//	sandgate netpol --apply                               server-side apply with field manager "sandgate-netpol"
//	sandgate netpol --rbac [--service-account NS/NAME]    the Roles and RoleBindings Sandgate needs
func runNetpol(ctx context.Context, env *cliEnv, args []string) error {
	fs := newFlags(env, "netpol", "netpol [--config FILE] [--template [NS/]NAME [--management Managed|Unmanaged]] [-o yaml|json] [--apply] [--kubeconfig FILE]\n       sandgate netpol --rbac [--service-account NS/NAME]")
	cfgPath := fs.String("config", "", "config file (default $SANDGATE_CONFIG, else "+defaultConfigRel+")")
	template := fs.String("template", "", "render only this SandboxTemplate ([NS/]NAME; NS defaults to the first of kubernetes.namespaces)")
	management := choiceFlag(fs, "management", "", "with --template: the template's `mode`, Managed or Unmanaged, rendered offline instead of read from the cluster", kube.Managed, kube.Unmanaged)
	output := choiceFlag(fs, "o", "yaml", "output `format`: yaml or json", "yaml", "json")
	apply := fs.Bool("apply", false, "apply with server-side apply (field manager \""+kube.FieldManager+"\") instead of printing")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default kubernetes.kubeconfig, else in-cluster, else $KUBECONFIG)")
	rbac := fs.Bool("rbac", false, "print the Roles and RoleBindings Sandgate needs and exit")
	serviceAccount := fs.String("service-account", "sandgate/sandgate", "with --rbac: the ServiceAccount (NS/NAME) to bind")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	// Mistakes in the command line are usage errors, found before any file is read.
	saNamespace, saName, ok := strings.Cut(*serviceAccount, "/")
	if *rbac && (!ok || saNamespace == "" || saName == "") {
		return usagef("--service-account wants NS/NAME, got %q", *serviceAccount)
	}
	if *management != "" && *template == "" {
		return usagef("--management needs --template")
	}
	path := *cfgPath
	if path == "" {
		path = env.getenv("SANDGATE_CONFIG")
	}
	if path == "" {
		path = defaultConfigRel
	}
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	k := cfg.Kubernetes
	if len(k.Namespaces) == 0 {
		return fmt.Errorf("config %s: kubernetes.namespaces is empty: list the namespaces that hold sandboxes", path)
	}

	if *rbac {
		k.Controller.Enabled = true // print what serve with the controller needs
		var jwks string
		if rt := cfg.RunTokens; rt != nil && rt.JWKSSecret != nil {
			jwks = rt.JWKSSecret.Name
		}
		objs := kube.RBAC(k, kube.RBACSubject{Kind: rbacv1.ServiceAccountKind, Namespace: saNamespace, Name: saName}, jwks)
		return kube.WriteDocuments(env.stdout, *output, objs)
	}

	desired, applier, err := netpolDesired(ctx, k, path, *template, *management, *apply, *kubeconfig)
	if err != nil {
		return err
	}
	if *apply {
		if err := applier.Apply(ctx, desired); err != nil {
			return err
		}
		fmt.Fprintf(env.stdout, "applied %s and %s (field manager %q)\n",
			plural(len(desired.NetworkPolicies), "NetworkPolicy"), plural(len(desired.Templates), "SandboxTemplate rule"), kube.FieldManager)
		return nil
	}
	objs, err := kube.Manifests(desired)
	if err != nil {
		return err
	}
	if len(objs) == 0 {
		return errors.New("nothing to render")
	}
	return kube.WriteDocuments(env.stdout, *output, objs)
}

// netpolDesired renders what netpol prints or applies: every template's rules read from the
// cluster, or one template's (read, or offline with --management). The applier is set unless
// rendering offline.
func netpolDesired(ctx context.Context, k config.Kubernetes, path, template, management string, apply bool, kubeconfig string) (kube.Desired, kube.Applier, error) {
	offline := management != "" && !apply
	var templates []kube.Template
	var applier kube.Applier
	if !offline {
		kc := kubeconfig
		if kc == "" {
			kc = k.Kubeconfig
		}
		rc, err := kube.RESTConfig(kc)
		if err != nil {
			return kube.Desired{}, applier, withOfflineHint(err, template, apply)
		}
		cs, dyn, err := kube.Clients(rc)
		if err != nil {
			return kube.Desired{}, applier, err
		}
		applier = kube.Applier{Client: cs, Dynamic: dyn}
		if template == "" {
			if templates, err = kube.ListTemplates(ctx, dyn, k.Namespaces); err != nil {
				return kube.Desired{}, applier, withOfflineHint(err, template, apply)
			}
		}
	}
	desired := kube.Render(k, templates)
	if template != "" {
		ns, name := k.Namespaces[0], template
		if before, after, ok := strings.Cut(template, "/"); ok {
			ns, name = before, after
		}
		if !slices.Contains(k.Namespaces, ns) {
			return kube.Desired{}, applier, fmt.Errorf("template %s/%s: namespace %q is not in kubernetes.namespaces of %s", ns, name, ns, path)
		}
		t := kube.Template{Namespace: ns, Name: name, Management: management}
		if management == "" {
			var err error
			if t, err = kube.GetTemplate(ctx, applier.Dynamic, ns, name); err != nil {
				return kube.Desired{}, applier, withOfflineHint(err, template, apply)
			}
		}
		desired = kube.RenderTemplate(k, t)
	}
	return desired, applier, nil
}

// withOfflineHint adds to a failure to reach the cluster how to render without one: one
// template at a time, with its management mode given (--management), which is all netpol
// reads of a template.
func withOfflineHint(err error, template string, apply bool) error {
	if apply {
		return err // applying needs the cluster
	}
	if template == "" {
		template = "NS/NAME"
	}
	return fmt.Errorf("%w\nwithout a cluster, render a template offline: sandgate netpol --template %s --management Managed (or Unmanaged)", err, template)
}
