# The shape of data.yaml (the example's data, or yours): what the shipped rules read, of the
# type they read it as. These tests hold for any valid edit of the values; the rules
# themselves are tested against fixtures (fixtures_test.rego).
package sandgate.data_test

import data.providers
import data.templates

test_every_template_has_the_sections_the_rules_read if {
	every name, t in templates {
		is_string(name)
		is_array(object.get(t, "tools", []))
		is_array(object.get(t, "hosts", []))
		is_object(object.get(t, "ports", {}))
		is_object(object.get(t, "models", {}))
		is_boolean(object.get(t, "enforce", true))
	}
}

test_every_tools_entry_names_an_upstream_and_patterns if {
	every _, t in templates {
		every entry in object.get(t, "tools", []) {
			is_string(entry.upstream)
			every p in entry.allow {
				is_string(p)
			}
			every p in object.get(entry, "grant_scoped", []) {
				is_string(p)
			}
		}
	}
}

test_every_model_entry_names_a_provider_with_a_cap if {
	every _, t in templates {
		every provider, m in object.get(t, "models", {}) {
			providers[provider]
			every model in m.allow {
				is_string(model)
			}
			is_number(m.max_tokens)
		}
	}
}

test_every_port_list_holds_port_numbers if {
	every _, t in templates {
		every _, ports in object.get(t, "ports", {}) {
			every p in ports {
				is_number(p)
				p >= 1
				p <= 65535
			}
		}
	}
}
