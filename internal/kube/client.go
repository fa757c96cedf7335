package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"
)

// RESTConfig loads a client configuration: the kubeconfig file at path when set, else the
// in-cluster service account when running in a pod, else the default kubeconfig loading rules
// ($KUBECONFIG, ~/.kube/config).
func RESTConfig(path string) (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if path != "" {
		rules.ExplicitPath = path
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config (set kubernetes.kubeconfig or run in a pod): %w", err)
	}
	cfg.UserAgent = "sandgate"
	return cfg, nil
}

// Clients builds the typed and dynamic clients Sandgate uses from one configuration.
func Clients(cfg *rest.Config) (kubernetes.Interface, dynamic.Interface, error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return cs, dyn, nil
}

// ListTemplates reads the SandboxTemplates of namespaces.
func ListTemplates(ctx context.Context, dyn dynamic.Interface, namespaces []string) ([]Template, error) {
	var out []Template
	for _, ns := range namespaces {
		list, err := dyn.Resource(SandboxTemplateGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list SandboxTemplates in %s: %w", ns, err)
		}
		for i := range list.Items {
			t, err := TemplateFromUnstructured(&list.Items[i])
			if err != nil {
				return nil, err
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// GetTemplate reads one SandboxTemplate.
func GetTemplate(ctx context.Context, dyn dynamic.Interface, ns, name string) (Template, error) {
	u, err := dyn.Resource(SandboxTemplateGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return Template{}, fmt.Errorf("get SandboxTemplate %s/%s: %w", ns, name, err)
	}
	return TemplateFromUnstructured(u)
}

// Manifests returns the apply configurations of d, in order: NetworkPolicies, then the
// spec.networkPolicy of Managed templates. Each is what Applier sends.
func Manifests(d Desired) ([]any, error) {
	var out []any
	for _, np := range d.NetworkPolicies {
		b, err := applyBody(np)
		if err != nil {
			return nil, err
		}
		var m map[string]any
		if err := yaml.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("decode NetworkPolicy %s/%s: %w", np.Namespace, np.Name, err)
		}
		out = append(out, m)
	}
	for _, t := range d.Templates {
		u, err := t.Object()
		if err != nil {
			return nil, err
		}
		out = append(out, u.Object)
	}
	return out, nil
}

// WriteDocuments writes objects as a YAML stream ("---" between documents) or, with format
// "json", as one JSON document per object.
func WriteDocuments(w io.Writer, format string, objs []any) error {
	for i, o := range objs {
		var b []byte
		var err error
		switch format {
		case "", "yaml":
			b, err = yaml.Marshal(o)
			if i > 0 {
				b = append([]byte("---\n"), b...)
			}
		case "json":
			b, err = json.MarshalIndent(o, "", "  ")
			b = append(b, '\n')
		default:
			return fmt.Errorf("output format %q: want yaml or json", format)
		}
		if err != nil {
			return fmt.Errorf("encode object %d: %w", i, err)
		}
		if _, err := io.WriteString(w, strings.TrimPrefix(string(b), "\n")); err != nil {
			return err
		}
	}
	return nil
}
