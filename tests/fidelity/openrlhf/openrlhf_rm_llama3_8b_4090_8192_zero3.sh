# The command reported in OpenRLHF issue #354 (2024-07-12, 6 x RTX 4090; conf/recipe/
# openrlhf_rm_llama3_8b_4090_8192_zero3.yaml), as the recipe header quotes it. It ran examples/train_rm.py of v0.3.5,
# the entry point openrlhf.cli.train_rm is since v0.3.7; --flash_attn is v0.9.0's --attn_implementation
# flash_attention_2; no --packing_samples (v0.3.5 had no such flag).
deepspeed --module openrlhf.cli.train_rm \
   --train_batch_size 126 \
   --micro_train_batch_size 1 \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --bf16 \
   --max_epochs 1 \
   --max_len 8192 \
   --zero_stage 3 \
   --learning_rate 9e-6 \
   --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku \
   --apply_chat_template \
   --lora_rank 64 \
   --lora_alpha 64 \
   --flash_attn \
   --gradient_checkpointing
