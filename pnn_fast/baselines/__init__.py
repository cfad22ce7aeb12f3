"""The paper's competing methods (Table 3) as training objectives; importing registers them."""
